package inplacectl

import (
	"reflect"
	"strings"
	"unicode/utf8"
)

// Clean removes from text the cluster gave what a terminal would act on rather than show:
// ESC and the sequence it starts (CSI "ESC [ ... final", OSC "ESC ] ... BEL or ESC \",
// and the two-byte escapes), the other C0 controls except tab and newline, DEL, and the
// C1 controls (U+0080 to U+009F, CSI and OSC among them). Bytes that are not UTF-8 are
// dropped too: a terminal may read them as C1 controls. Everything else is kept as it is.
//
// The printers show names, messages and reasons that anyone who can write the objects
// chose; without this, such a message could move the cursor, rewrite earlier lines, set
// the window title or the clipboard of whoever runs the plugin.
func Clean(s string) string {
	if !needsCleaning(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			i++
		case r == 0x1b:
			i = skipEscape(s, i)
		case r == 0x9b: // C1 CSI: parameters and a final byte follow, as after ESC [.
			i = skipCSI(s, i+size)
		case r == 0x9d, r == 0x90, r == 0x98, r == 0x9e, r == 0x9f: // C1 OSC, DCS, SOS, PM, APC: a string up to ST.
			i = skipString(s, i+size)
		case isControl(r):
			i += size
		default:
			b.WriteString(s[i : i+size])
			i += size
		}
	}
	return b.String()
}

func isControl(r rune) bool {
	return (r < 0x20 && r != '\t' && r != '\n') || r == 0x7f || (r >= 0x80 && r <= 0x9f)
}

func needsCleaning(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || isControl(r) {
			return true
		}
	}
	return false
}

// skipEscape returns the index after the escape sequence that starts with the ESC at i.
func skipEscape(s string, i int) int {
	i++
	if i >= len(s) {
		return i
	}
	switch s[i] {
	case '[':
		return skipCSI(s, i+1)
	case ']', 'P', 'X', '^', '_': // OSC, DCS, SOS, PM, APC: a string up to ST or BEL.
		return skipString(s, i+1)
	}
	// ESC followed by intermediate bytes (0x20-0x2f) and one final byte (0x30-0x7e).
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
		i++
	}
	if i < len(s) && s[i] >= 0x30 && s[i] <= 0x7e {
		i++
	}
	return i
}

// skipCSI skips a control sequence's parameter and intermediate bytes and its final byte.
func skipCSI(s string, i int) int {
	for i < len(s) && s[i] >= 0x20 && s[i] <= 0x3f {
		i++
	}
	if i < len(s) && s[i] >= 0x40 && s[i] <= 0x7e {
		i++
	}
	return i
}

// skipString skips a control string up to its terminator: BEL, ESC \ or C1 ST (U+009C).
func skipString(s string, i int) int {
	for i < len(s) {
		switch {
		case s[i] == 0x07:
			return i + 1
		case s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\':
			return i + 2
		case strings.HasPrefix(s[i:], "\u009c"):
			return i + len("\u009c")
		}
		i++
	}
	return i
}

// CleanCopy returns a deep copy of obj (a pointer) with every string in it, map keys
// included, passed through Clean: the printers print only what CleanCopy returns, so no
// field that the cluster supplies reaches the terminal raw, whichever a printer shows.
func CleanCopy[T any](obj *T) *T {
	if obj == nil {
		return nil
	}
	v := reflect.New(reflect.TypeOf(obj).Elem())
	v.Elem().Set(cleanValue(reflect.ValueOf(obj).Elem()))
	return v.Interface().(*T)
}

// cleanValue returns a copy of v with its strings cleaned. Unexported fields are copied
// as they are (no printer reads them).
func cleanValue(v reflect.Value) reflect.Value {
	switch v.Kind() {
	case reflect.String:
		out := reflect.New(v.Type()).Elem()
		out.SetString(Clean(v.String()))
		return out
	case reflect.Pointer:
		if v.IsNil() {
			return v
		}
		out := reflect.New(v.Type().Elem())
		out.Elem().Set(cleanValue(v.Elem()))
		return out
	case reflect.Interface:
		if v.IsNil() {
			return v
		}
		out := reflect.New(v.Type()).Elem()
		out.Set(cleanValue(v.Elem()))
		return out
	case reflect.Struct:
		out := reflect.New(v.Type()).Elem()
		out.Set(v)
		for i := range v.NumField() {
			if out.Field(i).CanSet() {
				out.Field(i).Set(cleanValue(v.Field(i)))
			}
		}
		return out
	case reflect.Slice:
		if v.IsNil() || v.Type().Elem().Kind() == reflect.Uint8 {
			return v
		}
		out := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		for i := range v.Len() {
			out.Index(i).Set(cleanValue(v.Index(i)))
		}
		return out
	case reflect.Array:
		out := reflect.New(v.Type()).Elem()
		for i := range v.Len() {
			out.Index(i).Set(cleanValue(v.Index(i)))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return v
		}
		out := reflect.MakeMapWithSize(v.Type(), v.Len())
		iter := v.MapRange()
		for iter.Next() {
			out.SetMapIndex(cleanValue(iter.Key()), cleanValue(iter.Value()))
		}
		return out
	}
	return v
}
