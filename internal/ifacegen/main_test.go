package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The committed generated files must be what the generator writes now.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	for file, fams := range map[string][]family{"ifaces_gen.go": families, "ifaces_fake_gen_test.go": fakes} {
		want, err := generate("lockhooks", fams)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate in the module root", file)
		}
	}
}
