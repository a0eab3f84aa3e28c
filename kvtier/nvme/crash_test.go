package nvme

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

const (
	crashDirEnv   = "KVTIER_NVME_CRASH_DIR"
	crashStartEnv = "KVTIER_NVME_CRASH_START"
	crashDurEnv   = "KVTIER_NVME_CRASH_DURABLE"
	crashSlots    = 32
	crashBytes    = 64 << 10
)

func crashConfig(dir string, durable bool) Config {
	return Config{Dirs: []string{dir}, SlotsPerFile: crashSlots, BlockBytes: crashBytes,
		MaxTokens: 8, Workers: 4, Durable: durable}
}

// TestHelperProcess is the writer that TestSIGKILLMidStream kills. It runs
// only when re-executed with KVTIER_NVME_CRASH_DIR set. It frees whatever
// it recovers, then writes keys start, start+1, ... forever, cycling over
// the slots, and prints "start KEY SLOT" before and "ack KEY SLOT" after
// each write.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("the writer child of TestSIGKILLMidStream")
	}
	start, _ := strconv.ParseUint(os.Getenv(crashStartEnv), 10, 64)
	s, err := Open(crashConfig(dir, os.Getenv(crashDurEnv) == "1"))
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	var held []Slot
	s.Range(func(slot Slot, _ BlockMeta) bool { held = append(held, slot); return true })
	for _, slot := range held {
		if err := s.Free(slot); err != nil {
			fmt.Println("free:", err)
			os.Exit(2)
		}
	}
	buf := alignedBuf(t, crashBytes)
	bySlot := map[Slot]uint64{}
	var order []Slot
	for key := start; ; key++ {
		if len(order) == crashSlots {
			old := order[0]
			order = order[1:]
			if err := s.Free(old); err != nil {
				fmt.Println("free:", err)
				os.Exit(2)
			}
			delete(bySlot, old)
		}
		slot, err := s.Allocate()
		if err != nil {
			fmt.Println("allocate:", err)
			os.Exit(2)
		}
		n := crashBytes - int(key%7)*1000 // some unaligned lengths
		fillPayload(buf[:n], key)
		fmt.Printf("start %d %d\n", key, slot)
		if err := s.Write(context.Background(), slot, metaFor(key, 4), buf[:n]); err != nil {
			fmt.Println("write:", err)
			os.Exit(2)
		}
		fmt.Printf("ack %d %d\n", key, slot)
		order = append(order, slot)
		bySlot[slot] = key
	}
}

// TestSIGKILLMidStream kills a writer process with SIGKILL in the middle of
// a stream of writes, reopens the store and checks that every block it can
// read is exactly what the writer meant for that key, and that every write
// the writer saw complete (and did not overwrite since) survived. It does so
// over several rounds on the same files, fast and durable.
func TestSIGKILLMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("re-executes the test binary")
	}
	dir := t.TempDir()
	for round, durable := range []bool{false, true, false, true} {
		start := uint64(round+1) * 1_000_000
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v=false")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir,
			crashStartEnv+"="+strconv.FormatUint(start, 10), crashDurEnv+"="+map[bool]string{false: "0", true: "1"}[durable])
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill after a varying number of completed writes.
		killAfter := 150 + 37*round
		acked := map[Slot]uint64{}    // last completed write per slot
		inflight := map[Slot]uint64{} // a started write per slot, not yet acked
		acks := 0
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 {
				t.Fatalf("round %d: writer said %q", round, sc.Text())
			}
			key, _ := strconv.ParseUint(f[1], 10, 64)
			slot64, _ := strconv.ParseUint(f[2], 10, 32)
			slot := Slot(slot64)
			switch f[0] {
			case "start":
				inflight[slot] = key
			case "ack":
				acked[slot] = key
				delete(inflight, slot)
				acks++
			}
			if acks == killAfter {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		// Drain what the writer printed before it died.
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 3 && f[0] == "start" {
				key, _ := strconv.ParseUint(f[1], 10, 64)
				slot64, _ := strconv.ParseUint(f[2], 10, 32)
				inflight[Slot(slot64)] = key
			} else if len(f) == 3 && f[0] == "ack" {
				key, _ := strconv.ParseUint(f[1], 10, 64)
				slot64, _ := strconv.ParseUint(f[2], 10, 32)
				acked[Slot(slot64)] = key
				delete(inflight, Slot(slot64))
			}
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: writer ended with %v, want killed by SIGKILL", round, err)
		}

		s := mustOpenNoCleanup(t, crashConfig(dir, durable))
		dst := alignedBuf(t, crashBytes)
		found := map[Slot]uint64{}
		s.Range(func(slot Slot, m BlockMeta) bool {
			got, err := s.Read(context.Background(), slot, dst)
			if err != nil {
				t.Fatalf("round %d: slot %d listed at open but unreadable: %v", round, slot, err)
			}
			n := crashBytes - int(got.Key%7)*1000
			want := make([]byte, n)
			fillPayload(want, got.Key)
			wm := metaFor(got.Key, 4)
			if got.PayloadBytes != n || string(dst[:n]) != string(want) || got.Parent != wm.Parent || got.Tokens[2] != wm.Tokens[2] {
				t.Fatalf("round %d: slot %d returned key %d with wrong contents", round, slot, got.Key)
			}
			found[slot] = got.Key
			return true
		})
		for slot, key := range acked {
			if _, busy := inflight[slot]; busy {
				if k := found[slot]; k != key && k != inflight[slot] && k != 0 {
					t.Fatalf("round %d: slot %d holds key %d, want %d, %d or nothing", round, slot, k, key, inflight[slot])
				}
				continue
			}
			if found[slot] != key {
				t.Fatalf("round %d: acknowledged key %d in slot %d lost after SIGKILL (found %d)", round, key, slot, found[slot])
			}
		}
		st := s.Stats()
		t.Logf("round %d (durable %v): killed after %d acks; reopened with %d blocks, %d corrupt dropped, %d duplicates", round, durable, acks, st.Recovered, st.CorruptDrops, st.DuplicateDrops)
		mustClose(t, s)
	}
}
