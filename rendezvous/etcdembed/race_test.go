//go:build race

package etcdembed

// raceBuild says whether the test binary was built with -race.
const raceBuild = true
