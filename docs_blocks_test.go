package weir_test

import (
	"bufio"
	"bytes"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// completeMarker is the line that marks the Go block after it as a
// complete program (docs/design.md, "Code in the docs").
const completeMarker = "<!-- complete program -->"

// minCompletePrograms is the number of marked complete programs in README.md
// and docs/*.md: the test fails if it finds fewer, so a program that loses
// its marker, or its block, does not silently leave the test.
const minCompletePrograms = 5

// docBlock is one fenced Go block of a Markdown file.
type docBlock struct {
	file   string // relative to the module root, forward slashes
	line   int    // the line of the block's first line of code
	code   string
	marked bool // the line before the fence is completeMarker
}

// goBlocks returns the ```go blocks of the Markdown file at path.
func goBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks []docBlock
		cur    *docBlock
		prev   string
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		case strings.TrimSpace(line) == "```go":
			cur = &docBlock{file: filepath.ToSlash(path), line: n + 1, marked: strings.TrimSpace(prev) == completeMarker}
		}
		prev = line
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```go block that is never closed", path, cur.line-1)
	}
	return blocks
}

// isProgram reports whether a block declares package main.
func isProgram(code string) bool {
	for l := range strings.SplitSeq(code, "\n") {
		if strings.TrimSpace(l) == "package main" {
			return true
		}
	}
	return false
}

// TestDocPrograms builds every Go block of README.md and docs/*.md marked
// as a complete program, each as a package of its own in one go build, and
// checks the marking: the README's first Go block is marked, every block
// that declares package main is marked and every marked block declares it,
// each is gofmt-formatted, and there are at least minCompletePrograms.
func TestDocPrograms(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH")
	}
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := goBlocks(t, "README.md")
	if len(readme) == 0 || !readme[0].marked {
		t.Errorf("README.md: the first Go block must be a complete program marked with %s on the line before its fence", completeMarker)
	}
	var marked []docBlock
	for _, b := range append(readme, docBlocks(t, docs)...) {
		switch {
		case b.marked && !isProgram(b.code):
			t.Errorf("%s:%d: marked as a complete program but does not declare package main", b.file, b.line)
		case !b.marked && isProgram(b.code):
			t.Errorf("%s:%d: declares package main but is not marked with %s", b.file, b.line, completeMarker)
		case b.marked:
			marked = append(marked, b)
		}
	}
	if len(marked) < minCompletePrograms {
		t.Errorf("found %d complete programs in README.md and docs/*.md, want at least %d", len(marked), minCompletePrograms)
	}
	for _, b := range marked {
		if src, err := format.Source([]byte(b.code)); err != nil || string(src) != b.code {
			t.Errorf("%s:%d: the program is not gofmt-formatted (err %v); gofmt would make it:\n%s", b.file, b.line, err, src)
		}
	}
	buildPrograms(t, marked)
}

// docBlocks returns the Go blocks of every file in paths.
func docBlocks(t *testing.T, paths []string) []docBlock {
	var all []docBlock
	for _, p := range paths {
		all = append(all, goBlocks(t, p)...)
	}
	return all
}

// buildPrograms writes each block into a directory of its own under one
// temporary directory inside the module (its name starts with "_", so
// "./..." patterns never see it) and builds them all with one go build;
// a //line directive makes the compiler's errors name the Markdown file
// and line.
func buildPrograms(t *testing.T, blocks []docBlock) {
	t.Helper()
	if len(blocks) == 0 {
		return
	}
	root, err := os.MkdirTemp(".", "_docprograms")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	args := []string{"build", "-o", os.DevNull}
	if len(blocks) > 1 {
		args = args[:1] // several packages: go build checks them and discards the results
	}
	for i, b := range blocks {
		dir := filepath.Join(root, fmt.Sprintf("p%02d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		src := fmt.Sprintf("//line %s:%d\n%s", b.file, b.line, b.code)
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "./"+filepath.ToSlash(dir))
	}
	cmd := exec.Command("go", args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
