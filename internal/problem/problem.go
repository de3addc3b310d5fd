// Package problem is what is wrong with a configuration file, as every
// parser reports it: each problem at its place (file, line, column) and
// all of them as one error, so that the rules file's problems and an
// envoyproxy/ratelimit directory's print and are read alike.
package problem

import (
	"errors"
	"fmt"
	"strings"
)

// Problem is one thing wrong with a configuration file; Line 0: the file
// as a whole.
type Problem struct {
	File   string
	Line   int
	Column int
	Msg    string
}

func (p Problem) String() string {
	if p.Line == 0 {
		return fmt.Sprintf("%s: %s", p.File, p.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", p.File, p.Line, p.Column, p.Msg)
}

// List is the error a parser returns: every problem it found, in file
// order, one a line.
type List []Problem

func (l List) Error() string {
	var b strings.Builder
	for i, p := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// As returns the problems carried by err, if any.
func As(err error) (List, bool) {
	var l List
	ok := errors.As(err, &l)
	return l, ok
}
