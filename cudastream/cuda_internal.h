// cuda_internal.h: what the C files under cuda_cgo.go share and the Go side
// does not see: the checks every wrapper starts with.

#ifndef KVTIER_CUDA_INTERNAL_H
#define KVTIER_CUDA_INTERNAL_H

#include "cuda_driver.h"

// DRV_CTX makes the device's primary context current on this thread.
#define DRV_CTX(t)                                                                                 \
	do {                                                                                           \
		if ((t)->ctxSetCurrent == NULL)                                                            \
			return DRV_MISSING;                                                                    \
		drvResult r_ = (t)->ctxSetCurrent((t)->ctx);                                               \
		if (r_ != 0)                                                                               \
			return r_ | DRV_CTX_FAILED;                                                            \
	} while (0)

#define DRV_NEED(t, fn)                                                                            \
	do {                                                                                           \
		if ((t)->fn == NULL)                                                                       \
			return DRV_MISSING;                                                                    \
	} while (0)

#endif
