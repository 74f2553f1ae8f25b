package comm

// GroupUse is how a rank uses one Group, for the memory the group's
// collectives keep (Bytes).
type GroupUse struct {
	// Members is the group's size; a group of one keeps nothing.
	Members int
	// SharedMemory says the rank's ring neighbors are on its node: its
	// two links then move chunks through shared slots (on Linux, unless
	// Config.TCPOnly).
	SharedMemory bool
	// ScatterOut is the length of the largest reduce-scatter output, in
	// elements of ScatterElem bytes (4; 8 for ReduceScatter64 and
	// ReduceScatterWiden); 0: the group runs no reduce-scatter.
	ScatterOut, ScatterElem int
	// Widen says the group runs ReduceScatterWiden.
	Widen bool
}

// Bytes is the memory a member keeps for the group's collectives once
// they have run, in bytes: one received chunk before it is added to the
// member's data; with SharedMemory, the slots of its two links (shared
// pages count in both processes' resident memory once touched); for
// reduce-scatters in groups of three members or more, two scratch buffers
// of one span, at most 1 MiB each; with Widen, one widened chunk before
// it is sent. The buffers do not grow with the data: a collective moves
// any length through them.
func (u GroupUse) Bytes() int64 {
	if u.Members < 2 {
		return 0
	}
	b := int64(chunkBytes)
	if u.SharedMemory {
		b += 2 * shmSlots * chunkBytes
	}
	if u.Members > 2 && u.ScatterOut > 0 {
		b += 2 * int64(min(u.ScatterOut, scratchBytes/u.ScatterElem)*u.ScatterElem)
	}
	if u.Widen {
		b += chunkBytes
	}
	return b
}
