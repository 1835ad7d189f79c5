package sqlscan

// TableTestInputs gives the external oracle test the table tests' inputs.
func TableTestInputs() []string {
	in := make([]string, len(noKeyCases))
	for i, c := range noKeyCases {
		in[i] = c.in
	}
	return in
}
