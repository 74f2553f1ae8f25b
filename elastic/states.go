package elastic

// States is every state of the agent, in the order of their values, from
// StateInit on: the values a State takes and a metric may be labelled
// with. It ends at the first value that String does not name, so a new
// state joins the list when it gets a name.
func States() []State {
	var states []State
	for s := StateInit; s.String() != "unknown"; s++ {
		states = append(states, s)
	}
	return states
}
