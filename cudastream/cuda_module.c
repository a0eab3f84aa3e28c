// cuda_module.c: PTX modules that packages above cudastream own, and
// launches of their kernels (module.go's ModuleLoader and Launcher).

#include "cuda_internal.h"

drvResult drvModuleLoad(drvTable *t, const char *ptx, drvCUmodule *m) {
	DRV_NEED(t, moduleLoadData);
	DRV_NEED(t, moduleGetFunction);
	DRV_NEED(t, moduleUnload);
	DRV_NEED(t, launchKernel);
	DRV_CTX(t);
	return t->moduleLoadData(m, ptx);
}

drvResult drvModuleFunction(drvTable *t, drvCUmodule m, const char *name, drvCUfunction *f) {
	DRV_NEED(t, moduleGetFunction);
	DRV_CTX(t);
	return t->moduleGetFunction(f, m, name);
}

drvResult drvModuleUnload(drvTable *t, drvCUmodule m) {
	DRV_NEED(t, moduleUnload);
	DRV_CTX(t);
	return t->moduleUnload(m);
}

drvResult drvLaunch(drvTable *t, drvCUstream s, drvCUfunction f, const unsigned *grid, const unsigned *block,
                    unsigned sharedBytes, const unsigned long long *args, unsigned nargs) {
	if (nargs > DRV_MAX_LAUNCH_ARGS)
		return 1; // CUDA_ERROR_INVALID_VALUE: the Go side checks nargs first
	DRV_NEED(t, launchKernel);
	DRV_CTX(t);
	void *params[DRV_MAX_LAUNCH_ARGS];
	for (unsigned i = 0; i < nargs; i++)
		params[i] = (void *)&args[i];
	return t->launchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2], sharedBytes, s, params, NULL);
}
