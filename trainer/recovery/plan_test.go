package recovery

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecide(t *testing.T) {
	live := func(step int64, lo, hi int) Offer { return Offer{Step: step, Lo: lo, Hi: hi} }
	extra := func(step int64, lo, hi int) Offer { return Offer{Step: step, Lo: lo, Hi: hi, Extra: true} }
	tests := []struct {
		name string
		all  []Announcement
		want Decision
	}{
		{"nobody holds anything", []Announcement{{Done: -1, Lo: 0, Hi: 6}, {Done: -1, Lo: 6, Hi: 12}},
			Decision{Source: None}},
		{"a lost slice", []Announcement{{Done: 4, Lo: 0, Hi: 12, Offers: []Offer{live(4, 0, 6)}}},
			Decision{Source: None, Redone: 4}},
		{"survivors keep their slices", []Announcement{
			{Done: 10, Lo: 0, Hi: 6, Offers: []Offer{live(10, 0, 6), live(9, 0, 6)}},
			{Done: 10, Lo: 6, Hi: 12, Offers: []Offer{live(10, 6, 12), live(9, 6, 12)}}},
			Decision{Source: Peers, Step: 10, Pieces: []Piece{{0, 0, 0, 6, 0}, {1, 1, 6, 12, 0}}}},
		{"a rank that completed one step more rolls back", []Announcement{
			{Done: 11, Lo: 0, Hi: 6, Offers: []Offer{live(11, 0, 6), live(10, 0, 6)}},
			{Done: 10, Lo: 6, Hi: 12, Offers: []Offer{live(11, 6, 12), live(10, 6, 12)}}},
			Decision{Source: Peers, Step: 10, Redone: 1, Pieces: []Piece{{0, 0, 0, 6, 1}, {1, 1, 6, 12, 1}}}},
		{"a fresh rank takes its slice from two holders", []Announcement{
			{Done: 10, Lo: 0, Hi: 4, Offers: []Offer{live(10, 0, 6)}},
			{Done: -1, Lo: 4, Hi: 8},
			{Done: 10, Lo: 8, Hi: 12, Offers: []Offer{live(10, 6, 12)}}},
			Decision{Source: Peers, Step: 10, Pieces: []Piece{
				{0, 0, 0, 4, 0}, {0, 1, 4, 6, 0}, {2, 1, 6, 8, 0}, {2, 2, 8, 12, 0}}}},
		{"two fresh ranks are served by two replicas", []Announcement{
			{Done: 3, Lo: 0, Hi: 12, Offers: []Offer{live(3, 0, 12)}},
			{Done: 3, Lo: 0, Hi: 12, Offers: []Offer{live(3, 0, 12)}},
			{Done: -1, Lo: 0, Hi: 12}, {Done: -1, Lo: 0, Hi: 12}},
			Decision{Source: Peers, Step: 3, Pieces: []Piece{
				{0, 0, 0, 12, 0}, {1, 1, 0, 12, 0}, {0, 2, 0, 12, 0}, {1, 3, 0, 12, 0}}}},
		{"padding past the model needs no holder", []Announcement{
			{Done: 2, Lo: 0, Hi: 14, Offers: []Offer{live(2, 0, 12)}}},
			Decision{Source: Peers, Step: 2, Pieces: []Piece{{0, 0, 0, 12, 0}}}},
		{"memory copies fill a lost slice", []Announcement{
			{Done: 7, Lo: 0, Hi: 12, Offers: []Offer{live(7, 0, 6), extra(6, 0, 6), extra(6, 6, 12)}}},
			Decision{Source: Memory, Step: 6, Redone: 1, Pieces: []Piece{{0, 0, 0, 6, 1}, {0, 0, 6, 12, 2}}}},
		{"memory copies are not used when live state covers", []Announcement{
			{Done: 7, Lo: 0, Hi: 6, Offers: []Offer{live(7, 0, 6), extra(7, 6, 12)}},
			{Done: 7, Lo: 6, Hi: 12, Offers: []Offer{live(7, 6, 12), extra(7, 0, 6)}}},
			Decision{Source: Peers, Step: 7, Pieces: []Piece{{0, 0, 0, 6, 0}, {1, 1, 6, 12, 0}}}},
		{"step 5 is held in full, but rank 1 never completed it", []Announcement{
			{Done: 5, Lo: 0, Hi: 12, Offers: []Offer{live(5, 0, 12), live(4, 0, 12)}},
			{Done: 4, Lo: 0, Hi: 12, Offers: []Offer{live(5, 0, 12), live(4, 0, 12)}}},
			Decision{Source: Peers, Step: 4, Redone: 1, Pieces: []Piece{{0, 0, 0, 12, 1}, {1, 1, 0, 12, 1}}}},
		// Stale rejoiners: a node cut off in round 1 at step 5 comes back
		// with its old workers after the others ran on in round 2.
		{"a stale rejoiner holding the whole model does not pull the running world back", []Announcement{
			{Done: 12, Round: 2, Lo: 0, Hi: 6, Offers: []Offer{live(12, 0, 12), live(11, 0, 12)}},
			{Done: 5, Round: 1, Lo: 6, Hi: 12, Offers: []Offer{live(5, 0, 12), live(4, 0, 12)}}},
			Decision{Source: Peers, Step: 12, Pieces: []Piece{{0, 0, 0, 6, 0}, {0, 1, 6, 12, 0}}}},
		{"stale rejoiners take their slices as fresh ranks do, from the least loaded holders", []Announcement{
			{Done: 12, Round: 2, Lo: 0, Hi: 6, Offers: []Offer{live(12, 0, 6), live(11, 0, 6)}},
			{Done: 12, Round: 2, Lo: 6, Hi: 12, Offers: []Offer{live(12, 6, 12), live(11, 6, 12)}},
			{Done: 12, Round: 2, Lo: 0, Hi: 6, Offers: []Offer{live(12, 0, 6), live(11, 0, 6)}},
			{Done: 12, Round: 2, Lo: 6, Hi: 12, Offers: []Offer{live(12, 6, 12), live(11, 6, 12)}},
			{Done: 5, Round: 1, Lo: 0, Hi: 6, Offers: []Offer{live(5, 0, 6), live(4, 0, 6)}},
			{Done: 4, Round: 1, Lo: 6, Hi: 12, Offers: []Offer{live(5, 6, 12), live(4, 6, 12)}}},
			Decision{Source: Peers, Step: 12, Pieces: []Piece{
				{0, 0, 0, 6, 0}, {1, 1, 6, 12, 0}, {2, 2, 0, 6, 0}, {3, 3, 6, 12, 0}, {0, 4, 0, 6, 0}, {1, 5, 6, 12, 0}}}},
		{"a stale rank's older step is never chosen, even when nothing newer covers", []Announcement{
			{Done: 12, Round: 2, Lo: 0, Hi: 6, Offers: []Offer{live(12, 0, 6), live(11, 0, 6)}},
			{Done: 5, Round: 1, Lo: 6, Hi: 12, Offers: []Offer{live(5, 0, 12), live(4, 0, 12)}}},
			Decision{Source: None, Redone: 12}},
		{"a stale rank ahead of the running world does not lift the cap", []Announcement{
			{Done: 10, Round: 3, Lo: 0, Hi: 12, Offers: []Offer{live(10, 0, 12)}},
			{Done: 11, Round: 2, Lo: 0, Hi: 12, Offers: []Offer{live(11, 0, 12), live(10, 0, 12)}}},
			Decision{Source: Peers, Step: 10, Pieces: []Piece{{0, 0, 0, 12, 0}, {1, 1, 0, 12, 1}}}},
		{"a stale rank's holding of the running world's cap fills a lost slice", []Announcement{
			{Done: 10, Round: 3, Lo: 0, Hi: 6, Offers: []Offer{live(10, 0, 6), live(9, 0, 6)}},
			{Done: 11, Round: 2, Lo: 6, Hi: 12, Offers: []Offer{live(11, 6, 12), live(10, 6, 12)}}},
			Decision{Source: Peers, Step: 10, Pieces: []Piece{{0, 0, 0, 6, 0}, {1, 1, 6, 12, 1}}}},
		{"a rank without live state is never the running world, whatever its round", []Announcement{
			{Done: -1, Round: 9, Lo: 0, Hi: 6},
			{Done: 3, Round: 2, Lo: 6, Hi: 12, Offers: []Offer{live(3, 0, 12)}}},
			Decision{Source: Peers, Step: 3, Pieces: []Piece{{1, 0, 0, 6, 0}, {1, 1, 6, 12, 0}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := cloneAnnouncements(tc.all)
			require.Equal(t, tc.want, Decide(tc.all, 12))
			require.Equal(t, before, tc.all, "Decide changes nothing it reads")
		})
	}
}

func cloneAnnouncements(all []Announcement) []Announcement {
	out := slices.Clone(all)
	for i := range out {
		out[i].Offers = slices.Clone(out[i].Offers)
	}
	return out
}

func TestAnnouncementWire(t *testing.T) {
	a := Announcement{Done: 7, Round: 4, Lo: 3, Hi: 9, Offers: []Offer{{Step: 7, Lo: 0, Hi: 6}, {Step: 6, Lo: 6, Hi: 12, Extra: true}}}
	got, err := DecodeAnnouncement(a.Encode())
	require.NoError(t, err)
	require.Equal(t, a, got)
	empty := Announcement{Done: -1}
	got, err = DecodeAnnouncement(empty.Encode())
	require.NoError(t, err)
	require.Equal(t, empty, got)

	tests := []struct {
		name string
		b    []byte
	}{
		{"short", a.Encode()[:30]},
		{"trailing bytes", append(a.Encode(), 0)},
		{"backwards range", Announcement{Done: 1, Lo: 5, Hi: 2}.Encode()},
		{"bad offer", Announcement{Done: 1, Offers: []Offer{{Step: -3}}}.Encode()},
		{"negative round", Announcement{Done: 1, Round: -2}.Encode()},
		{"more offers than bytes", withCount(a.Encode(), 1<<62)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeAnnouncement(tc.b)
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
}

// withCount is b, an encoded Announcement, claiming n offers.
func withCount(b []byte, n uint64) []byte {
	b = slices.Clone(b)
	binary.LittleEndian.PutUint64(b[32:], n)
	return b
}

// FuzzAnnouncement: any bytes a peer sends as its Announcement decode or
// fail with ErrMalformed, never a panic; what decodes encodes back to the
// same bytes, and Decide over it (alone, or beside a rank that holds the
// model) never panics and deals only ranges it was offered.
func FuzzAnnouncement(f *testing.F) {
	for _, a := range []Announcement{
		{Done: -1},
		{Done: 7, Round: 4, Lo: 3, Hi: 9, Offers: []Offer{{Step: 7, Lo: 0, Hi: 6}, {Step: 6, Lo: 6, Hi: 12, Extra: true}}},
		{Done: 5, Round: 1, Lo: 0, Hi: 12, Offers: []Offer{{Step: 5, Lo: 0, Hi: 12}, {Step: 4, Lo: 0, Hi: 12}}},
	} {
		f.Add(a.Encode())
	}
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := DecodeAnnouncement(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		if !bytes.Equal(a.Encode(), b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, a, a.Encode())
		}
		if len(a.Offers) > 64 {
			return // Decide's work grows with the offers; the wire bounds nothing else
		}
		holder := Announcement{Done: 3, Round: 2, Lo: 0, Hi: 12, Offers: []Offer{{Step: 3, Lo: 0, Hi: 12}}}
		for _, all := range [][]Announcement{{a}, {holder, a}, {a, holder}} {
			d := Decide(all, 12)
			for _, p := range d.Pieces {
				o := all[p.Src].Offers[p.Offer]
				if o.Step != d.Step || p.Lo < o.Lo || p.Hi > o.Hi || p.Lo >= p.Hi {
					t.Fatalf("piece %+v outside offer %+v of step %d", p, o, d.Step)
				}
			}
		}
	})
}
