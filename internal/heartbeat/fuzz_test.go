package heartbeat

import "testing"

// FuzzChannelLines: any line on the channel, either way, is read or
// refused, never a panic; a progress line read back writes a line that
// reads the same.
func FuzzChannelLines(f *testing.F) {
	for _, s := range []string{"12", "12 loss=3.41 tokens_per_s=5123.4 mfu=0.31 compute_s=0.2 round=2 redone=4", "await 7 peer=3",
		`round {"rank":1,"world_size":2}`, "round {", "await x", "12 loss=+Inf", "-3 round=NaN", "", "silent peer=4", "silent peer=-1", "silent 4", `next {"rank":1,"world_size":2}`, "next {"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		_, _, _ = ParseAwait(line)
		_, _, _ = ParseRound(line)
		if c, ok, err := ParseContract(line); ok && err == nil {
			again, _, err := ParseContract(func() string {
				if c.AtBoundary {
					l, _ := NextLine(c.Worker)
					return l
				}
				l, _ := RoundLine(c.Worker)
				return l
			}())
			if err != nil || again.AtBoundary != c.AtBoundary {
				t.Fatalf("%q: its own line does not read back: %+v, %v", line, again, err)
			}
		}
		if peer, ok, err := ParseSilent(line); ok && err == nil {
			if again, _, err := ParseSilent(SilentLine(peer)); err != nil || again != peer {
				t.Fatalf("%q: its own line %q reads back as %d, %v", line, SilentLine(peer), again, err)
			}
		}
		p, err := ParseLine(line)
		if err != nil {
			return
		}
		again, err := ParseLine(p.Line())
		if err != nil {
			t.Fatalf("%q: its own line %q does not read: %v", line, p.Line(), err)
		}
		if again.Line() != p.Line() {
			t.Fatalf("%q: %q reads back as %q", line, p.Line(), again.Line())
		}
	})
}
