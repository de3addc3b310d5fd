package problem_test

import (
	"fmt"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

func TestListReadsAsOneErrorAndBack(t *testing.T) {
	l := problem.List{
		{File: "a.yaml", Line: 2, Column: 3, Msg: "bucket x is not defined"},
		{File: "b.yaml", Msg: "the file is empty"},
	}
	const want = "a.yaml:2:3: bucket x is not defined\nb.yaml: the file is empty"
	if got := l.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	got, ok := problem.As(fmt.Errorf("load: %w", l))
	if !ok || len(got) != 2 || got[1] != l[1] {
		t.Errorf("As(wrapped) = %v, %v", got, ok)
	}
	if _, ok := problem.As(fmt.Errorf("load: %w", fmt.Errorf("no file"))); ok {
		t.Error("As finds problems in an error without any")
	}
}
