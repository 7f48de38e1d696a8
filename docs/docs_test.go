package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// maxLines is issue 42's limit: no page a newcomer reads is over about 400
// lines (docs/notes/, the history, is exempt).
const maxLines = 400

// repoRoot is the checkout, seen from this package's directory.
const repoRoot = ".."

// pages lists the Markdown files under root that the tests read: README.md
// and every .md file under docs/, with their paths relative to root.
func pages(t *testing.T, root string) []string {
	t.Helper()
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// exempt says whether a page may be longer than maxLines: the history in docs/notes/.
func exempt(page string) bool { return strings.HasPrefix(page, "docs/notes/") }

// countLines counts lines as wc -l does, plus a last line without a newline.
func countLines(text string) int {
	n := strings.Count(text, "\n")
	if text != "" && !strings.HasSuffix(text, "\n") {
		n++
	}
	return n
}

func TestPagesAreShort(t *testing.T) {
	checked := 0
	for _, page := range pages(t, repoRoot) {
		if exempt(page) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, page))
		if err != nil {
			t.Fatal(err)
		}
		checked++
		if n := countLines(string(b)); n > maxLines {
			t.Errorf("%s has %d lines, over %d: split it (docs/notes/ excepted)", page, n, maxLines)
		}
	}
	if checked < 2 {
		t.Fatalf("checked %d pages: the walk found no docs", checked)
	}
}

// lines splits a Markdown text into lines and marks those inside fenced code
// blocks (``` or ~~~), where neither headings nor links count.
func lines(text string) (out []string, inCode []bool) {
	fence := ""
	for _, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(l, " ")
		indent := len(l) - len(trimmed)
		switch {
		case fence != "":
			out, inCode = append(out, l), append(inCode, true)
			if indent < 4 && strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" \t") == "" {
				fence = ""
			}
			continue
		case indent < 4 && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")):
			c := trimmed[:1]
			fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, c))]
			out, inCode = append(out, l), append(inCode, true)
			continue
		}
		out, inCode = append(out, l), append(inCode, false)
	}
	return out, inCode
}

var (
	atxHeading    = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextLine    = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	htmlAnchor    = regexp.MustCompile(`<a\s[^>]*\b(?:id|name)\s*=\s*"([^"]+)"`)
	inlineLink    = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	referenceLink = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	codeSpan      = regexp.MustCompile("(`+)[^`]*?(`+)")
	htmlTag       = regexp.MustCompile(`<[^>]+>`)
	emphasis      = regexp.MustCompile(`\*+|(^|\W)_+|_+(\W|$)`)
	orderedItem   = regexp.MustCompile(`^\d+[.)]\s`)
	urlScheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// headingText renders a heading's Markdown roughly as GitHub shows it: a
// link or image becomes its text, code spans keep their content, emphasis
// markers and HTML tags go.
func headingText(md string) string {
	md = inlineLink.ReplaceAllString(md, "$1")
	md = codeSpan.ReplaceAllStringFunc(md, func(s string) string { return strings.Trim(s, "`") })
	md = htmlTag.ReplaceAllString(md, "")
	return emphasis.ReplaceAllString(md, "$1$2")
}

// slugify is GitHub's anchor for a heading's text: lower case, every
// character but letters, marks, digits, '_', '-' and spaces dropped, each
// space a '-'.
func slugify(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) || unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown text as GitHub makes them: one
// per heading (a repeated one gets -1, -2, ...), plus HTML id and name attributes.
func anchors(text string) map[string]bool {
	occurrences := map[string]int{}
	out := map[string]bool{}
	add := func(heading string) {
		slug := slugify(headingText(heading))
		base := slug
		for {
			if _, taken := occurrences[slug]; !taken {
				break
			}
			occurrences[base]++
			slug = fmt.Sprintf("%s-%d", base, occurrences[base])
		}
		occurrences[slug] = 0
		out[slug] = true
	}
	ls, inCode := lines(text)
	for i, l := range ls {
		if inCode[i] {
			continue
		}
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			add(m[1])
			continue
		}
		if i > 0 && !inCode[i-1] && setextLine.MatchString(l) && paragraphLine(ls[i-1]) &&
			(i < 2 || inCode[i-2] || strings.TrimSpace(ls[i-2]) == "") {
			add(strings.TrimSpace(ls[i-1]))
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
	}
	return out
}

// paragraphLine says whether a line can be the text of a setext heading: not
// blank, not indented code, not a list item, table row, quote or ATX heading.
func paragraphLine(l string) bool {
	t := strings.TrimSpace(l)
	if t == "" || strings.HasPrefix(l, "    ") || strings.HasPrefix(l, "\t") {
		return false
	}
	for _, p := range []string{"#", "|", "-", "*", "+", ">"} {
		if strings.HasPrefix(t, p) {
			return false
		}
	}
	return !orderedItem.MatchString(t)
}

// link is one link target of a page and the line it is on.
type link struct {
	line   int
	target string
}

// links returns the link targets of a Markdown text: inline links and
// images, and reference definitions, outside code blocks and code spans.
func links(text string) []link {
	var out []link
	ls, inCode := lines(text)
	for i, l := range ls {
		if inCode[i] {
			continue
		}
		if m := referenceLink.FindStringSubmatch(l); m != nil {
			out = append(out, link{i + 1, m[1]})
			continue
		}
		l = codeSpan.ReplaceAllString(l, "``")
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			out = append(out, link{i + 1, m[2]})
		}
	}
	return out
}

// external says whether a target leaves the repository: a URL with a scheme
// (https:, mailto:) or a host.
func external(target string) bool {
	return urlScheme.MatchString(target) || strings.HasPrefix(target, "//")
}

// checkLinks returns a line per relative link of the given pages (paths
// relative to root) whose file does not exist or whose anchor is no heading
// of that file.
func checkLinks(root string, pageList []string) ([]string, error) {
	var problems []string
	anchorCache := map[string]map[string]bool{}
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchorCache[file]; ok {
			return a, nil
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		anchorCache[file] = anchors(string(b))
		return anchorCache[file], nil
	}
	for _, page := range pageList {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			return nil, err
		}
		for _, l := range links(string(b)) {
			if l.target == "" || external(l.target) {
				continue
			}
			where := fmt.Sprintf("%s:%d: link %q", page, l.line, l.target)
			path, fragment, _ := strings.Cut(l.target, "#")
			if p, err := url.PathUnescape(path); err == nil {
				path = p
			}
			file := filepath.Join(root, page)
			if path != "" {
				if strings.HasPrefix(path, "/") {
					file = filepath.Join(root, path)
				} else {
					file = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				}
			}
			info, err := os.Stat(file)
			if err != nil {
				problems = append(problems, where+": no such file")
				continue
			}
			if fragment == "" {
				continue
			}
			if info.IsDir() || !strings.HasSuffix(file, ".md") {
				problems = append(problems, where+": an anchor into something that is not a Markdown file")
				continue
			}
			a, err := anchorsOf(file)
			if err != nil {
				return nil, err
			}
			if f, err := url.PathUnescape(fragment); err == nil {
				fragment = f
			}
			if !a[fragment] {
				problems = append(problems, fmt.Sprintf("%s: no heading of %s has the anchor #%s", where, filepath.ToSlash(mustRel(root, file)), fragment))
			}
		}
	}
	return problems, nil
}

func mustRel(root, file string) string {
	rel, err := filepath.Rel(root, file)
	if err != nil {
		return file
	}
	return rel
}

func TestLinksResolve(t *testing.T) {
	list := pages(t, repoRoot)
	problems, err := checkLinks(repoRoot, list)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("checked the relative links of %d pages", len(list))
}

func TestSlugify(t *testing.T) {
	for _, tc := range []struct{ heading, want string }{
		{"Operator guide", "operator-guide"},
		{"Backup, restore and move", "backup-restore-and-move"},
		{"cluster get, cluster list, image list", "cluster-get-cluster-list-image-list"},
		{"Registry: pull-only, one view per cluster", "registry-pull-only-one-view-per-cluster"},
		{"Issue 38: three holes found while writing docs/security.md (2026-12-05, third stop)", "issue-38-three-holes-found-while-writing-docssecuritymd-2026-12-05-third-stop"},
		{"`--node-image` and *the* accelerator", "--node-image-and-the-accelerator"},
		{"snake_case stays", "snake_case-stays"},
		{"A [linked](other.md#x) word", "a-linked-word"},
		{"Five warm starts at once", "five-warm-starts-at-once"},
		{"Ünïcode Wörds", "ünïcode-wörds"},
	} {
		if got := slugify(headingText(tc.heading)); got != tc.want {
			t.Errorf("slugify(%q) = %q, want %q", tc.heading, got, tc.want)
		}
	}
}

func TestAnchors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"levels", "# Top\n\n## Sub part\n\n###### Deep ###\n", []string{"top", "sub-part", "deep"}},
		{"duplicates get -1 and -2", "## Node network\n### Node network\n## Node network\n", []string{"node-network", "node-network-1", "node-network-2"}},
		{"a heading that looks like a suffixed duplicate", "## A\n## A\n## A-1\n", []string{"a", "a-1", "a-1-1"}},
		{"not in fenced code", "```sh\n# not a heading\n```\n~~~\n# nor this\n~~~\n# Real\n", []string{"real"}},
		{"not indented code", "text\n\n    # comment in a block\n", nil},
		{"needs a space after the hashes", "#hashtag\n# ok\n", []string{"ok"}},
		{"setext", "Title\n=====\n\nSub title\n---\n\n- item\n---\n", []string{"title", "sub-title"}},
		{"html anchor", "<a id=\"here\"></a>\n", []string{"here"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for a := range anchors(tc.text) {
				got = append(got, a)
			}
			sort.Strings(got)
			want := append([]string(nil), tc.want...)
			sort.Strings(want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("anchors = %q, want %q", got, want)
			}
		})
	}
}

func TestLinks(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"inline", "see [a](a.md) and [b](b.md#x).", []string{"a.md", "b.md#x"}},
		{"title and angle brackets", "[a](a.md \"A\") [b](<b.md>)", []string{"a.md", "b.md"}},
		{"image", "![pic](img/p.png)", []string{"img/p.png"}},
		{"brackets in the text", "[`x` [y]](c.md)", []string{"c.md"}},
		{"reference definition", "[ref]: docs/x.md#y\n", []string{"docs/x.md#y"}},
		{"not in code span", "`[a](nope.md)` and [b](yes.md)", []string{"yes.md"}},
		{"not in fenced code", "```\n[a](nope.md)\n```\n", nil},
		{"external kept for the caller to skip", "[w](https://example.com)", []string{"https://example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, l := range links(tc.text) {
				got = append(got, l.target)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("links = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCheckLinksFindsBreaks runs the checker on a made-up tree, so that a
// checker that finds nothing does not pass unnoticed.
func TestCheckLinksFindsBreaks(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"README.md": "# Read me\n\n[ok](docs/a.md#part-two) [dir](docs/notes/) [gone](docs/gone.md)\n" +
			"[bad anchor](docs/a.md#part-three) [self](#read-me) [self bad](#nope) [web](https://example.com/x.md)\n",
		"docs/a.md":         "# A\n\n## Part two\n\n## Part two\n\n[dup](#part-two-1) [up](../README.md#read-me) [anchor on a dir](notes/#x)\n",
		"docs/notes/old.md": "# Old\n\n[back](../a.md#a)\n",
	}
	for name, text := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := checkLinks(root, pages(t, root))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`README.md:3: link "docs/gone.md": no such file`,
		`README.md:4: link "docs/a.md#part-three": no heading of docs/a.md has the anchor #part-three`,
		`README.md:4: link "#nope": no heading of README.md has the anchor #nope`,
		`docs/a.md:7: link "notes/#x": an anchor into something that is not a Markdown file`,
	}
	sort.Strings(got)
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCountLines(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int
	}{{"", 0}, {"a", 1}, {"a\n", 1}, {"a\nb", 2}, {"a\n\nb\n", 3}} {
		if got := countLines(tc.text); got != tc.want {
			t.Errorf("countLines(%q) = %d, want %d", tc.text, got, tc.want)
		}
	}
}
