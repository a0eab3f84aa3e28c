package pinned_test

import (
	"context"
	"fmt"

	"kvtier.dev/kvtier/pinned"
)

// A server starts on the first chunk while the rest pins in the background.
// With a GPU, pass the cudastream.Device as the Registrar and its NUMA node
// in NUMANodes.
func ExampleAlloc_background() {
	ctx := context.Background()
	r, err := pinned.Alloc(ctx, 16*pinned.MiB, pinned.Options{
		Registrar:  pinned.MlockRegistrar{},
		ChunkBytes: 4 * pinned.MiB,
		Background: true,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()

	if err := r.WaitReady(ctx, 4*pinned.MiB); err != nil { // the first chunk
		fmt.Println(err)
		return
	}
	first := r.Bytes()[:4*pinned.MiB] // registered: safe to hand to the copy engine
	first[0] = 1

	if err := r.Wait(ctx); err != nil { // all of it
		fmt.Println(err)
		return
	}
	st := r.Stats()
	fmt.Println(r.ReadyBytes()/pinned.MiB, "MiB ready in", st.Chunks, "chunks of", st.PageMode, "pages")
	// Output: 16 MiB ready in 4 chunks of THP pages
}
