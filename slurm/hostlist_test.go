package slurm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestExpandHostlist(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{"", []string{}},
		{" ,\t, ", []string{}},
		{"n1", []string{"n1"}},
		{"n007", []string{"n007"}},
		{"n[1-3]", []string{"n1", "n2", "n3"}},
		{"n[1]", []string{"n1"}},
		{"n[3-3]", []string{"n3"}},
		{"n[1-3,7,10-11]", []string{"n1", "n2", "n3", "n7", "n10", "n11"}},
		{"n[08-11]", []string{"n08", "n09", "n10", "n11"}},
		{"n[8-011]", []string{"n8", "n9", "n10", "n11"}},                                    // width from the low number
		{"n[1-010]", []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"}}, // likewise
		{"n[01-3]", []string{"n01", "n02", "n03"}},
		{"n[00-2]", []string{"n00", "n01", "n02"}},
		{"n[1,01,001]", []string{"n1", "n01", "n001"}},
		{"n[9-10,011]", []string{"n9", "n10", "n011"}},
		{"n[3,1,2,1]", []string{"n3", "n1", "n2", "n1"}}, // no sorting, no de-duplication
		{"[1-2]", []string{"1", "2"}},
		{"n[1-2],[3]", []string{"n1", "n2", "3"}},
		{"rack[1-2]-node[01-02]", []string{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}},
		{"n[1-2][3-4]", []string{"n13", "n14", "n23", "n24"}},
		{"n[1]-[2]", []string{"n1-2"}},
		// SLURM's order for three and more groups: the group before the last varies slowest.
		{"a[0-1]b[0-1]c[0-1]", []string{"a0b0c0", "a0b0c1", "a1b0c0", "a1b0c1", "a0b1c0", "a0b1c1", "a1b1c0", "a1b1c1"}},
		{"a[0-1]b[0-1]c[0-1]d[0]", []string{"a0b0c0d0", "a1b0c0d0", "a0b1c0d0", "a1b1c0d0", "a0b0c1d0", "a1b0c1d0", "a0b1c1d0", "a1b1c1d0"}},
		// Suffix after the last bracket: newer SLURM's extension.
		{"node[1-2]-ib", []string{"node1-ib", "node2-ib"}},
		{"a[1-2]b[3]c", []string{"a1b3c", "a2b3c"}},
		{"n[1-2]x,n[3]x", []string{"n1x", "n2x", "n3x"}},
		// Separators outside brackets.
		{"a b,c", []string{"a", "b", "c"}},
		{",a,,b,", []string{"a", "b"}},
		{"n[1-2] , m", []string{"n1", "n2", "m"}},
		{"a\tb", []string{"a", "b"}},
		{"a\nb\r\nc\n", []string{"a", "b", "c"}}, // scontrol keeps \n inside names; we split
		{"n1-n3", []string{"n1-n3"}},
		{"n-", []string{"n-"}},
		{"n18446744073709551615", []string{"n18446744073709551615"}},
		{"n99999999999999999999", []string{"n99999999999999999999"}}, // scontrol: n18446744073709551615
		{"n[18446744073709551614-18446744073709551615]", []string{"n18446744073709551614", "n18446744073709551615"}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := ExpandHostlist(tt.expr)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestExpandHostlistErrors(t *testing.T) {
	tests := []struct {
		expr, reason string
	}{
		{"n[5-3]", "range start 5 > end 3"},
		{"n[1-", `"[" at offset 1 is never closed`},
		{"n[", `"[" at offset 1 is never closed`},
		{"[", `"[" at offset 0 is never closed`},
		{"a,n[1-2", `"[" at offset 3 is never closed`},
		{"n]", `"]" without "[" at offset 1`},
		{"n[1-2]]", `"]" without "[" at offset 6`},
		{"a]b[1,2]", `"]" without "[" at offset 1`},
		{"n[[1]]", `nested "[" at offset 2`},
		{"x[a[1]b[2]", `nested "[" at offset 3`},
		{"n[a-b]", `invalid range "a-b" in [a-b]`},
		{"x[]", `empty brackets "[]"`},
		{"n[1,,2]", "empty range in [1,,2]"},
		{"n[1,]", "empty range in [1,]"},
		{"n[-3]", `invalid range "-3"`},
		{"n[3-]", `invalid range "3-"`},
		{"n[-]", `invalid range "-"`},
		{"n[1-2-3]", `invalid range "1-2-3"`},
		{"n[1--3]", `invalid range "1--3"`},
		{"n[0x1]", `invalid range "0x1"`},
		{"n[+1]", `invalid range "+1"`},
		{"n[1a-3]", `invalid range "1a-3"`},
		{"n[ 1-3]", "whitespace inside brackets at offset 2"},
		{"n[1, 3]", "whitespace inside brackets at offset 4"},
		{"n[1-2\n]", "whitespace inside brackets at offset 5"},
		{"n[99999999999999999999]", "number 99999999999999999999 in [99999999999999999999] is too large"},
		{"n[1-65537]", "range 1-65537 has more than 65536 hosts, SLURM's limit for one range"},
		{"n[0-18446744073709551615]", "has more than 65536 hosts"},
		{"a[1-65536,1]b[1]", "65537 hosts in bracket group 1"},
		{"a[1-65536]b[1-17]", "expands to more than 1048576 hosts, the limit of this package"},
		{"n[1-65536],m[1-65536],a[1-65536]b[1-15]", "expands to more than 1048576 hosts"},
		{"n[" + strings.Repeat("0", 1100) + "1-65536]", "expands to more than 64 MiB of host names"},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := ExpandHostlist(tt.expr)
			require.Error(t, err, "got %d hosts", len(got))
			require.Nil(t, got)
			var he *HostlistError
			require.ErrorAs(t, err, &he)
			require.Equal(t, tt.expr, he.Expr)
			require.Contains(t, he.Reason, tt.reason)
			require.True(t, strings.HasPrefix(err.Error(), fmt.Sprintf("slurm: hostlist %q: ", tt.expr)), err.Error())
		})
	}
}

func TestExpandHostlistErrorMessage(t *testing.T) {
	_, err := ExpandHostlist("n[5-3]")
	require.EqualError(t, err, `slurm: hostlist "n[5-3]": range start 5 > end 3`)
}

func TestExpandHostlistLimits(t *testing.T) {
	hosts, err := ExpandHostlist("a[1-65536]b[1-16]")
	require.NoError(t, err)
	require.Len(t, hosts, MaxHosts)
	require.Equal(t, "a1b1", hosts[0])
	require.Equal(t, "a1b2", hosts[1])
	require.Equal(t, "a65536b16", hosts[MaxHosts-1])

	hosts, err = ExpandHostlist("n[0-65535]")
	require.NoError(t, err)
	require.Len(t, hosts, 65536)
}

func TestCompressHostlist(t *testing.T) {
	tests := []struct {
		hosts []string
		want  string
	}{
		{nil, ""},
		{[]string{"n1"}, "n1"},
		{[]string{"login"}, "login"},
		{[]string{"n1", "n2", "n3"}, "n[1-3]"},
		{[]string{"n3", "n1", "n2"}, "n[3,1-2]"},
		{[]string{"n1", "n2", "m1", "n3"}, "n[1-2],m1,n3"},
		{[]string{"n1", "m1", "n2"}, "n1,m1,n2"},
		{[]string{"n1", "n1", "n2"}, "n[1,1-2]"},
		{[]string{"n08", "n09", "n10"}, "n[08-10]"},
		{[]string{"n8", "n9", "n10"}, "n[8-10]"},
		{[]string{"n9", "n10", "n011"}, "n[9-10,011]"},
		{[]string{"n98", "n99", "n100"}, "n[98-100]"},
		{[]string{"n01", "n1"}, "n[01,1]"},
		{[]string{"n1", "n01", "n2"}, "n[1,01,2]"},
		{[]string{"n0", "n00", "n000"}, "n[0,00,000]"},
		{[]string{"a1b1", "a1b2", "a2b1"}, "a1b[1-2],a2b1"},
		{[]string{"n", "n1", "n2"}, "n,n[1-2]"},
		{[]string{"1", "2", "3"}, "[1-3]"},
		{[]string{"a-1", "a-2"}, "a-[1-2]"},
		{[]string{"nid00002", "nid00003"}, "nid[00002-00003]"},
		{[]string{"node1-ib", "node2-ib"}, "node1-ib,node2-ib"},
		{[]string{"n18446744073709551614", "n18446744073709551615", "n18446744073709551616"},
			"n[18446744073709551614-18446744073709551615],n18446744073709551616"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			require.Equal(t, tt.want, CompressHostlist(tt.hosts))
			back, err := ExpandHostlist(tt.want)
			require.NoError(t, err)
			if tt.hosts == nil {
				tt.hosts = []string{}
			}
			require.Equal(t, tt.hosts, back, "round trip")
		})
	}
}

func TestCompressHostlistRoundTrip(t *testing.T) {
	for _, expr := range []string{
		"n[1-100]", "n[001-100]", "n[7-9,10-12,099-101]", "rack[1-3]-node[01-16]", "a[0-1]b[0-1]c[0-1]",
		"n[5,4,3,2,1]", "n[1-3,2-4]", "x,y,z", "n[1-3]-ib,n[1-3]", "[0-20]",
	} {
		t.Run(expr, func(t *testing.T) {
			hosts, err := ExpandHostlist(expr)
			require.NoError(t, err)
			back, err := ExpandHostlist(CompressHostlist(hosts))
			require.NoError(t, err)
			require.Equal(t, hosts, back)
		})
	}
}

// roundTrips reports whether CompressHostlist promises a round trip for hosts: every name
// non-empty and free of brackets, commas and whitespace.
func roundTrips(hosts []string) bool {
	for _, h := range hosts {
		if h == "" || strings.ContainsAny(h, "[], \t\n\r\v\f") {
			return false
		}
	}
	return true
}

func FuzzExpandHostlist(f *testing.F) {
	for _, s := range []string{
		"", "n1", "n[1-3]", "n[08-11]", "n[8-011]", "rack[1-2]-node[01-02]", "a[0-1]b[0-1]c[0-1]",
		"node[1-2]-ib", "n[1-3,7,10-11] m", "n[5-3]", "n[1-", "x[]", "n]", "a\nb", "n[1,01]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		hosts, err := ExpandHostlist(expr)
		if err != nil {
			require.Nil(t, hosts)
			var he *HostlistError
			require.ErrorAs(t, err, &he)
			return
		}
		require.LessOrEqual(t, len(hosts), MaxHosts)
		if !roundTrips(hosts) {
			return
		}
		compressed := CompressHostlist(hosts)
		back, err := ExpandHostlist(compressed)
		require.NoError(t, err, "compressed %q", compressed)
		require.Equal(t, hosts, back, "compressed %q", compressed)
	})
}
