package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// report is the JUnit XML e2e.test writes into --report-dir (junit_01.xml: ginkgo's
// reporter, one testcase per spec, status = the spec's state).
type report struct {
	Suites []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
}

// readReport reads every junit_*.xml of dir.
func readReport(dir string) (report, error) {
	files, _ := filepath.Glob(filepath.Join(dir, "junit_*.xml"))
	if len(files) == 0 {
		return report{}, fmt.Errorf("no junit_*.xml in %s", dir)
	}
	var r report
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return report{}, err
		}
		one, err := parseReport(b)
		if err != nil {
			return report{}, fmt.Errorf("%s: %w", f, err)
		}
		r.Suites = append(r.Suites, one.Suites...)
	}
	return r, nil
}

func parseReport(b []byte) (report, error) {
	var r report
	if err := xml.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("junit XML: %w", err)
	}
	return r, nil
}

// testName is a spec's full text without ginkgo's leaf type ("[It] "), or "" for the
// suite's own setup and teardown nodes ([SynchronizedBeforeSuite], [ReportAfterSuite]...).
func testName(c junitCase) string {
	name, ok := strings.CutPrefix(c.Name, "[It] ")
	if !ok {
		return ""
	}
	return name
}

// failed says whether a spec's state is a failure of any kind.
func failed(status string) bool {
	switch status {
	case "failed", "panicked", "interrupted", "aborted", "timedout":
		return true
	}
	return false
}

// selected are the names of the specs the run took (in a dry run: all "passed").
func (r report) selected() []string {
	var out []string
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if n := testName(c); n != "" && c.Status != "skipped" && c.Status != "pending" {
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

type skippedTest struct{ name, reason string }

// inFocus says whether a test's name matches the selection's focus and label filter
// (the conformance labels are in the name as [Conformance], [Serial]...).
func (s sel) inFocus(name string) bool {
	f, err := regexp.Compile(s.focus)
	if err != nil || !f.MatchString(name) {
		return false
	}
	return strings.Contains(name, "[Conformance]") && !strings.Contains(name, "[Serial]") &&
		!strings.Contains(name, "[Slow]") && !strings.Contains(name, "[Disruptive]")
}

// skippedBy are the in-focus tests not run, each with the reason: a skip pattern of
// ours, or the test's own Skip.
func (r report) skippedBy(s sel) []skippedTest {
	var out []skippedTest
	for _, su := range r.Suites {
		for _, c := range su.Cases {
			n := testName(c)
			if n == "" || c.Status != "skipped" || !s.inFocus(n) {
				continue
			}
			reason := "skipped by the test"
			if c.Skipped != nil && strings.HasPrefix(c.Skipped.Message, "skipped - ") {
				reason = "the test skipped itself: " + strings.TrimPrefix(c.Skipped.Message, "skipped - ")
			}
			for _, sr := range s.skipped {
				if re, err := regexp.Compile(sr.pattern); err == nil && re.MatchString(n) {
					reason = sr.reason
					break
				}
			}
			out = append(out, skippedTest{n, reason})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// summary is what a run prints.
type summary struct {
	passed, failed int
	failures       []string
	skipped        []skippedTest
	notSelected    int
	setupFailures  []string // suite-level nodes that failed
}

func (r report) summary(s sel) summary {
	var sum summary
	for _, su := range r.Suites {
		for _, c := range su.Cases {
			n := testName(c)
			switch {
			case n == "" && failed(c.Status):
				sum.setupFailures = append(sum.setupFailures, c.Name)
			case n == "":
			case c.Status == "passed":
				sum.passed++
			case failed(c.Status):
				sum.failed++
				sum.failures = append(sum.failures, n)
			}
		}
	}
	sum.skipped = r.skippedBy(s)
	for _, su := range r.Suites {
		for _, c := range su.Cases {
			if n := testName(c); n != "" && (c.Status == "skipped" || c.Status == "pending") && !s.inFocus(n) {
				sum.notSelected++
			}
		}
	}
	sort.Strings(sum.failures)
	return sum
}

// print writes the summary: the counts line first, exactly as documented, then the
// skips and the failures' names.
func (sum summary) print(w io.Writer) {
	fmt.Fprintf(w, "conformance: %d passed, %d failed\n", sum.passed, sum.failed)
	fmt.Fprintf(w, "skipped: %d in focus (reasons below), %d not selected\n", len(sum.skipped), sum.notSelected)
	for _, f := range sum.failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
	for _, f := range sum.setupFailures {
		fmt.Fprintf(w, "FAILED (suite setup): %s\n", f)
	}
	for _, sk := range sum.skipped {
		fmt.Fprintf(w, "SKIPPED: %s -- %s\n", sk.name, sk.reason)
	}
}
