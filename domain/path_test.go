package domain

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
)

// HostilePaths is testdata/hostile_paths.json, the table the Go, Python
// and TypeScript tests share.
type HostilePaths struct {
	Refused  []string `json:"refused"`
	Accepted []string `json:"accepted"`
}

func TestCheckPathHostileTable(t *testing.T) {
	raw, err := os.ReadFile("../testdata/hostile_paths.json")
	if err != nil {
		t.Fatal(err)
	}
	var tab HostilePaths
	if err := json.Unmarshal(raw, &tab); err != nil || len(tab.Refused) == 0 || len(tab.Accepted) == 0 {
		t.Fatalf("hostile_paths.json: %v", err)
	}
	for _, p := range tab.Refused {
		if err := CheckPath(p); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("CheckPath(%q) = %v, want ErrUnsafePath", p, err)
		}
	}
	for _, p := range tab.Accepted {
		if err := CheckPath(p); err != nil {
			t.Errorf("control: CheckPath(%q) = %v, want nil", p, err)
		}
	}
}
