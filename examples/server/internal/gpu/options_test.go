package gpu

import (
	"strings"
	"testing"
)

// TestRowBucket: a bucket holds its rows, is its own bucket, pads by at
// most 15 rows up to 128 and by at most 1/8 of the rows above, keeps a
// decode step's single row, and never shrinks as the rows grow; a server's
// 16,400-token context has 66 of them.
func TestRowBucket(t *testing.T) {
	prev := 0
	for n := 1; n <= 1<<16; n++ {
		b := RowBucket(n)
		switch {
		case b < n || b < prev:
			t.Fatalf("RowBucket(%d) = %d (RowBucket(%d) = %d)", n, b, n-1, prev)
		case RowBucket(b) != b:
			t.Fatalf("RowBucket(%d) = %d, but RowBucket(%d) = %d", n, b, b, RowBucket(b))
		case n <= 128 && b-n > 15, n > 128 && 8*(b-n) > n:
			t.Fatalf("RowBucket(%d) = %d pads too much", n, b)
		}
		prev = b
	}
	if RowBucket(1) != 1 || RowBucket(2) != 16 || RowBucket(129) != 144 || RowBucket(16400) != 18432 {
		t.Fatalf("RowBucket of 1, 2, 129, 16400: %d %d %d %d", RowBucket(1), RowBucket(2), RowBucket(129), RowBucket(16400))
	}
	bs := RowBuckets(16400)
	if len(bs) != 66 || bs[0] != 1 || bs[len(bs)-1] != 18432 {
		t.Fatalf("RowBuckets(16400): %d buckets, %v", len(bs), bs)
	}
	if o := (Options{ExactRows: true}); o.rows(7) != 7 || (Options{}).rows(7) != 16 {
		t.Fatal("Options.rows ignores ExactRows")
	}
}

// TestAttentionWarmUps: rows under FusedMinTokens and under the keys, for
// each doubling of the keys from 128.
func TestAttentionWarmUps(t *testing.T) {
	o, _ := Options{MaxTokens: 1, MaxContext: 1}.withDefaults()
	got := o.attentionWarmUps(300)
	want := [][2]int{{128, 1}, {128, 8}, {128, 16}, {128, 32}, {128, 63}, {256, 1}, {256, 8}, {256, 16}, {256, 32}, {256, 63}}
	if len(got) != len(want) {
		t.Fatalf("attentionWarmUps(300): %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("attentionWarmUps(300): %v, want %v", got, want)
		}
	}
	o.FusedMinTokens = 9
	if got := o.attentionWarmUps(128); len(got) != 2 || got[1] != [2]int{128, 8} {
		t.Fatalf("FusedMinTokens 9: %v, want rows 1 and 8", got)
	}
	if got := o.attentionWarmUps(100); len(got) != 0 {
		t.Fatalf("100 keys: %v, want none", got)
	}
}

// TestKeys: the attention products' keys are a multiple of 64 within the
// K scratch's capacity, or exact with ExactRows.
func TestKeys(t *testing.T) {
	o := Options{MaxTokens: 100, MaxContext: 2007}
	if o.keys(1) != 64 || o.keys(64) != 64 || o.keys(2007) != 2048 || o.keyCap() != 2048 {
		t.Fatalf("keys of 1, 64, 2007: %d %d %d; capacity %d", o.keys(1), o.keys(64), o.keys(2007), o.keyCap())
	}
	o.ExactRows = true
	if o.keys(2007) != 2007 {
		t.Fatalf("ExactRows: keys(2007) = %d", o.keys(2007))
	}
}

// TestAttentionOption: ParseAttention reads what String writes and refuses
// other names; withDefaults refuses an Attention out of range and changes
// nothing else.
func TestAttentionOption(t *testing.T) {
	for a := range numAttention {
		got, err := ParseAttention(a.String())
		if err != nil || got != a {
			t.Fatalf("ParseAttention(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAttention("flash"); err == nil || !strings.Contains(err.Error(), `"flash"`) {
		t.Fatalf("ParseAttention(flash): %v", err)
	}
	for _, a := range []Attention{-1, numAttention} {
		o := Options{MaxTokens: 1, MaxContext: 1, Attention: a}
		if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), "Options.Attention") {
			t.Fatalf("Attention %d: %v", int(a), err)
		}
	}
	if o, err := (Options{MaxTokens: 1, MaxContext: 1, Attention: AttentionWGMMA}).withDefaults(); err != nil || o.Attention != AttentionWGMMA {
		t.Fatalf("AttentionWGMMA: %+v, %v", o, err)
	}
}
