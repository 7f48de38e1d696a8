// Package runbook finds the shell commands in the project's Markdown docs and says
// which of them a test runs, so that the docs cannot rot. A code block after
//
//	<!-- runbook: NAME -->
//
// is part of the script NAME (its blocks in document order), which a live test runs
// with bash -euo pipefail. A block after
//
//	<!-- not run: WHY -->
//
// is not run, for the reason given (a placeholder, a service outside the project, a
// live test that runs the same commands). A block of commands with neither marker is
// an error: a command cannot enter the docs without a test or a reason.
package runbook

import (
	"fmt"
	"regexp"
	"strings"
)

// Block is one marked code block.
type Block struct {
	File string
	Line int // of the block's first line, from 1
	// Runbook is the script the block belongs to; "" for a block that is not run.
	Runbook string
	// NotRun says why the block is not run; "" for a runbook block.
	NotRun string
	Text   string // the block's lines, without the indent or fences
}

var (
	markerRE = regexp.MustCompile(`^<!--\s*(runbook:|not run:)\s*(.*?)\s*-->\s*$`)
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	// commandRE matches a line that starts with a command a reader would type.
	commandRE = regexp.MustCompile(`^(sudo\s+)?([A-Z_]+=\S*\s+)*(bin/[a-z]|\./|hack/[a-z]|socialweb\b|kubectl\b|curl\b|bash\b|apt(-get)?\b|dpkg\b|systemctl\b|journalctl\b|gitlab-runner\b|export\b|sleep\b|kill\b|go\b|git\b|psql\b|pg_dump\b|promtool\b|mkdir\b|rm\b|cp\b|cat\b|tar\b|timeout\b)`)
)

// block is a code block as found, before its marker is looked at.
type block struct {
	line   int // from 1
	lines  []string
	marker string // the marker line before it, if any
	mline  int
}

// Parse returns the marked code blocks of a Markdown file. Its error lists every block of
// commands with no marker, and every marker not followed by a code block.
func Parse(file string, md []byte) ([]Block, error) {
	blocks, orphans := codeBlocks(strings.Split(string(md), "\n"))
	var out []Block
	var problems []string
	for _, l := range orphans {
		problems = append(problems, fmt.Sprintf("%s:%d: a runbook marker with no code block after it", file, l))
	}
	for _, b := range blocks {
		text := strings.Join(b.lines, "\n")
		if b.marker == "" {
			if isCommands(b.lines) {
				problems = append(problems, fmt.Sprintf("%s:%d: a block of commands with no marker before it: "+
					"put <!-- runbook: NAME --> (a test runs it) or <!-- not run: WHY --> on the line before", file, b.line))
			}
			continue
		}
		m := markerRE.FindStringSubmatch(b.marker)
		kind, arg := m[1], m[2]
		switch {
		case kind == "runbook:" && !nameRE.MatchString(arg):
			problems = append(problems, fmt.Sprintf("%s:%d: runbook name %q: want lower-case letters, digits and dashes", file, b.mline, arg))
		case kind == "not run:" && arg == "":
			problems = append(problems, fmt.Sprintf("%s:%d: <!-- not run: --> without a reason", file, b.mline))
		case kind == "runbook:":
			out = append(out, Block{File: file, Line: b.line, Runbook: arg, Text: text})
		default:
			out = append(out, Block{File: file, Line: b.line, NotRun: arg, Text: text})
		}
	}
	if len(problems) > 0 {
		return out, fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return out, nil
}

// Script is the bash script of runbook name: its blocks in order, each after a comment
// naming where it comes from.
func Script(blocks []Block, name string) string {
	var b strings.Builder
	for _, bl := range blocks {
		if bl.Runbook != name {
			continue
		}
		fmt.Fprintf(&b, "# %s:%d\n%s\n", bl.File, bl.Line, bl.Text)
	}
	return b.String()
}

// Names lists the runbooks of blocks, each once, in order of first appearance.
func Names(blocks []Block) []string {
	var names []string
	seen := map[string]bool{}
	for _, b := range blocks {
		if b.Runbook != "" && !seen[b.Runbook] {
			seen[b.Runbook] = true
			names = append(names, b.Runbook)
		}
	}
	return names
}

func isCommands(lines []string) bool {
	for _, l := range lines {
		if commandRE.MatchString(strings.TrimSpace(l)) {
			return true
		}
	}
	return false
}

// codeBlocks finds the indented and fenced code blocks of lines, each with the marker
// (an HTML comment line of markerRE) that precedes it across blank lines, and the
// lines of markers with no block after them.
func codeBlocks(lines []string) (blocks []block, orphans []int) {
	marker, mline := "", 0
	prevBlank := true
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.TrimSpace(l) == "":
			prevBlank = true
			continue
		case markerRE.MatchString(strings.TrimSpace(l)):
			if marker != "" {
				orphans = append(orphans, mline)
			}
			marker, mline = strings.TrimSpace(l), i+1
			prevBlank = true // a marker ends its HTML block: an indented block may follow
			continue
		case strings.HasPrefix(strings.TrimLeft(l, " "), "```") || strings.HasPrefix(strings.TrimLeft(l, " "), "~~~"):
			fence := strings.TrimLeft(l, " ")[:3]
			b := block{line: i + 2, marker: marker, mline: mline}
			for i++; i < len(lines) && !strings.HasPrefix(strings.TrimLeft(lines[i], " "), fence); i++ {
				b.lines = append(b.lines, lines[i])
			}
			blocks = append(blocks, b)
		case prevBlank && (strings.HasPrefix(l, "    ") || strings.HasPrefix(l, "\t")):
			b := block{line: i + 1, marker: marker, mline: mline}
			for ; i < len(lines); i++ {
				if strings.TrimSpace(lines[i]) == "" {
					// A blank line continues the block if an indented line follows it.
					j := i
					for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
						j++
					}
					if j < len(lines) && (strings.HasPrefix(lines[j], "    ") || strings.HasPrefix(lines[j], "\t")) {
						for ; i < j; i++ {
							b.lines = append(b.lines, "")
						}
						i--
						continue
					}
					break
				}
				if !strings.HasPrefix(lines[i], "    ") && !strings.HasPrefix(lines[i], "\t") {
					break
				}
				b.lines = append(b.lines, strings.TrimPrefix(strings.TrimPrefix(lines[i], "    "), "\t"))
			}
			i--
			blocks = append(blocks, b)
		default:
			// Prose: a marker must sit right before its block, blank lines apart.
			if marker != "" {
				orphans = append(orphans, mline)
			}
		}
		marker, mline = "", 0
		prevBlank = false
	}
	if marker != "" {
		orphans = append(orphans, mline)
	}
	return blocks, orphans
}
