package inplacectl

import (
	"fmt"
	"io"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// errWriter keeps the first write error, so a printer writes its lines plainly and
// returns that error once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(e, format, args...)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func suffix(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

// oneLine keeps a table row on one line: a multi-line reason would break the columns.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func order(o int32) string {
	if o == 0 {
		return "-"
	}
	return fmt.Sprint(o)
}

func ordinal(n int32) string {
	switch {
	case n%100 >= 11 && n%100 <= 13:
		return fmt.Sprintf("%dth", n)
	case n%10 == 1:
		return fmt.Sprintf("%dst", n)
	case n%10 == 2:
		return fmt.Sprintf("%dnd", n)
	case n%10 == 3:
		return fmt.Sprintf("%drd", n)
	}
	return fmt.Sprintf("%dth", n)
}

func duration(d *metav1.Duration) string {
	if d == nil {
		return "-"
	}
	return humanDuration(d.Duration)
}

// humanDuration rounds to the second (to the minute beyond an hour), as kubectl's ages
// do: sub-second digits are noise on a screen that is redrawn every few seconds.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d >= time.Hour {
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Second).String()
}
