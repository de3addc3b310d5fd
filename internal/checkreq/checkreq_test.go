package checkreq

import (
	"slices"
	"testing"
)

func TestFieldsLastWins(t *testing.T) {
	var f Fields
	f = f.Set("a", "1").Set("b", "2").Set("a", "3")
	if len(f) != 2 || f.Value("a") != "3" || f.Value("b") != "2" {
		t.Fatalf("Set: %v", f)
	}
	if v, ok := f.Get("c"); ok || v != "" {
		t.Fatalf("Get of an absent name: %q %v", v, ok)
	}
	if v, ok := (Fields{{"e", ""}}).Get("e"); !ok || v != "" {
		t.Fatal("an empty value is present")
	}
	m := map[string]string{"z": "1", "a": "2", "m": "3"}
	if got := AppendMap(nil, m, nil); !slices.Equal(got, Fields{{"a", "2"}, {"m", "3"}, {"z", "1"}}) {
		t.Fatalf("AppendMap all: %v", got)
	}
	if got := AppendMap(nil, m, []string{"m", "q", "a"}); !slices.Equal(got, Fields{{"m", "3"}, {"a", "2"}}) {
		t.Fatalf("AppendMap names: %v", got)
	}
}
