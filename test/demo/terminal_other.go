//go:build !linux && !darwin

package main

import "os"

// ttySize is unknown here; the demo falls back to $COLUMNS, 80 columns and 40 lines.
func ttySize(*os.File) (cols, rows int) { return 0, 0 }
