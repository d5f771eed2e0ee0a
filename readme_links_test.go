package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks checks that every relative link in README.md and docs/*.md resolves: the
// file or directory it names exists and, for a `#anchor` into a Markdown file, the file has
// a heading with that anchor (GitHub's rules: lowercase, punctuation other than '-' and '_'
// removed, spaces to '-', a repeated heading's anchor followed by -1, -2, ...). Absolute
// links (http, https, mailto) are not checked, nor anything inside code.
func TestDocLinks(t *testing.T) {
	// The anchor rules themselves, on headings the docs have.
	for text, want := range map[string]string{
		"The cluster's UpgradePlan":                 "the-clusters-upgradeplan",
		"6. Makespan of a Harvester upgrade":        "6-makespan-of-a-harvester-upgrade",
		"The v1.6 → v1.7 node migrations":           "the-v16--v17-node-migrations",
		"Why `spec.version` is never written":       "why-specversion-is-never-written",
		"`kubectl inplace preview CLUSTER VERSION`": "kubectl-inplace-preview-cluster-version",
		"A [linked](x.md) heading_with_underscores": "a-linked-heading_with_underscores",
	} {
		if got := githubAnchor(text); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", text, got, want)
		}
	}

	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"README.md"}, files...)

	anchors := map[string]map[string]bool{} // Markdown file -> the anchors of its headings
	checked := 0
	for _, file := range files {
		doc, err := readMarkdown(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range doc.links {
			target := strings.TrimSuffix(strings.TrimPrefix(l.target, "<"), ">")
			lower := strings.ToLower(target)
			if strings.HasPrefix(lower, "http://") || strings.HasPrefix(lower, "https://") || strings.HasPrefix(lower, "mailto:") {
				continue
			}
			checked++
			where := fmt.Sprintf("%s:%d: link %q", file, l.line, l.target)
			if strings.Contains(target, "://") {
				t.Errorf("%s: an absolute link of a scheme this test does not know", where)
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file // "#anchor" alone points into the file itself
			if path != "" {
				if strings.HasPrefix(path, "/") {
					t.Errorf("%s: a path from the root of the site; write it relative to %s", where, file)
					continue
				}
				resolved = filepath.Clean(filepath.Join(filepath.Dir(file), filepath.FromSlash(path)))
			}
			info, err := os.Stat(resolved)
			if err != nil {
				t.Errorf("%s: %s does not exist", where, resolved)
				continue
			}
			if anchor == "" || info.IsDir() || !strings.HasSuffix(strings.ToLower(resolved), ".md") {
				continue // anchors into other files (#L10 of a Go file) are not checked
			}
			if anchors[resolved] == nil {
				target, err := readMarkdown(resolved)
				if err != nil {
					t.Fatal(err)
				}
				anchors[resolved] = target.anchors
			}
			if !anchors[resolved][anchor] {
				t.Errorf("%s: %s has no heading with the anchor #%s", where, resolved, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found in README.md and docs/*.md: the test reads nothing")
	}
	t.Logf("%d relative links checked in %d files", checked, len(files))
}

type markdownLink struct {
	line   int
	target string
}

type markdownDoc struct {
	links   []markdownLink
	anchors map[string]bool
}

var (
	// An inline link or image, [text](target "title"); the text may hold one level of
	// brackets and run over lines.
	inlineLink = regexp.MustCompile(`\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^()\s]*)(?:\s+"[^"]*")?\s*\)`)
	// A reference definition: [label]: target
	referenceDef = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*(\S+)`)
	// An HTML anchor: <a name="x"> or <a id="x">.
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*(?:name|id)="([^"]+)"`)
	// A link or image in a heading, which GitHub renders as its text.
	headingLink = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)`)
)

// readMarkdown reads a Markdown file's links and its headings' anchors, leaving out fenced
// code blocks and code spans.
func readMarkdown(path string) (markdownDoc, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return markdownDoc{}, err
	}
	doc := markdownDoc{anchors: map[string]bool{}}
	seen := map[string]int{}
	lines := strings.Split(strings.ReplaceAll(string(raw), "\r\n", "\n"), "\n")
	text := make([]string, len(lines)) // the lines outside code, code spans blanked
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, fence[:1])) == "" {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			n := len(trimmed) - len(strings.TrimLeft(trimmed, trimmed[:1]))
			fence = trimmed[:n]
			continue
		}
		text[i] = blankCodeSpans(line)

		for _, m := range htmlAnchor.FindAllStringSubmatch(text[i], -1) {
			doc.anchors[m[1]] = true
		}
		if len(line)-len(trimmed) > 3 || !strings.HasPrefix(trimmed, "#") {
			continue
		}
		level := len(trimmed) - len(strings.TrimLeft(trimmed, "#"))
		heading := trimmed[level:]
		if level > 6 || (heading != "" && heading[0] != ' ' && heading[0] != '\t') {
			continue
		}
		heading = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(heading), "#")) // closing #s
		anchor := githubAnchor(heading)
		if k := seen[anchor]; k > 0 {
			doc.anchors[fmt.Sprintf("%s-%d", anchor, k)] = true
		} else {
			doc.anchors[anchor] = true
		}
		seen[anchor]++
	}

	all := strings.Join(text, "\n")
	lineOf := func(offset int) int { return strings.Count(all[:offset], "\n") + 1 }
	for _, m := range inlineLink.FindAllStringSubmatchIndex(all, -1) {
		doc.links = append(doc.links, markdownLink{lineOf(m[2]), all[m[2]:m[3]]})
	}
	for _, m := range referenceDef.FindAllStringSubmatchIndex(all, -1) {
		doc.links = append(doc.links, markdownLink{lineOf(m[2]), all[m[2]:m[3]]})
	}
	return doc, nil
}

// blankCodeSpans replaces each code span of a line (a run of backticks, up to the next run
// of as many) with spaces, so that nothing in it is read as a link.
func blankCodeSpans(line string) string {
	b := []byte(line)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(b) && b[j+m] == '`' {
				m++
			}
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n // no closing run: the backticks are text
			continue
		}
		for k := i; k < end; k++ {
			b[k] = ' '
		}
		i = end
	}
	return string(b)
}

// githubAnchor is the anchor GitHub gives a heading's text: links by their text, lowercase,
// every character other than a letter, a digit, '-', '_' or a space removed, spaces turned
// into '-'.
func githubAnchor(text string) string {
	text = headingLink.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
