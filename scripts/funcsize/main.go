// Command funcsize measures the functions of a Go module's non-test code: their length in lines and their
// cyclomatic complexity, and fails when a threshold is exceeded.
//
// Length is the number of source lines from a function declaration's `func` keyword to its closing brace
// (function literals count toward the function that contains them). Complexity is McCabe's, counted the way
// gocyclo does: one, plus one for each if, for, range, non-default case or comm clause, && and ||.
//
// Usage (run from the module root; scripts/test.sh does):
//
//	go run ./scripts/funcsize [-max-lines 120] [-max-complexity 40] [-max-p90 40] [-top 10] [dir]
//
// It prints the p50/p90/max length, the share of functions over complexity 15, the functions over either limit,
// and the longest ones; it exits 1 when a function is over a limit or the p90 length is over -max-p90.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type fn struct {
	name       string // pkg-relative: file.go:Recv.Name
	pos        string
	lines      int
	complexity int
}

func main() {
	maxLines := flag.Int("max-lines", 120, "fail when a function is longer than this many lines")
	maxCx := flag.Int("max-complexity", 40, "fail when a function's cyclomatic complexity is over this")
	maxP90 := flag.Int("max-p90", 40, "fail when the 90th-percentile function length is over this")
	top := flag.Int("top", 10, "print this many of the longest functions")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	fns, err := collect(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "funcsize:", err)
		os.Exit(2)
	}
	if len(fns) == 0 {
		fmt.Fprintln(os.Stderr, "funcsize: no Go functions under", root)
		os.Exit(2)
	}
	if !report(os.Stdout, fns, *maxLines, *maxCx, *maxP90, *top) {
		os.Exit(1)
	}
}

// collect parses every non-test .go file under root, skipping testdata, vendor and hidden directories and
// directories that are not Go code of the module (python).
func collect(root string) ([]fn, error) {
	fset := token.NewFileSet()
	var fns []fn
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" ||
				name == "python" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
			fns = append(fns, fn{
				name:       funcName(fd),
				pos:        fmt.Sprintf("%s:%d", filepath.ToSlash(path), start.Line),
				lines:      end.Line - start.Line + 1,
				complexity: complexity(fd),
			})
		}
		return nil
	})
	return fns, err
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
			continue
		case *ast.IndexExpr:
			t = x.X
			continue
		case *ast.IndexListExpr:
			t = x.X
			continue
		}
		break
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// complexity is gocyclo's count: 1 + decision points.
func complexity(fd *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fd, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []int, p float64) int {
	i := int(float64(len(sorted))*p+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func report(w *os.File, fns []fn, maxLines, maxCx, maxP90, top int) bool {
	lens := make([]int, len(fns))
	over15 := 0
	for i, f := range fns {
		lens[i] = f.lines
		if f.complexity > 15 {
			over15++
		}
	}
	sort.Ints(lens)
	p90 := percentile(lens, 0.9)
	fmt.Fprintf(w, "funcsize: %d functions; length p50 %d, p90 %d, max %d lines; %.1f%% over complexity 15\n",
		len(fns), percentile(lens, 0.5), p90, lens[len(lens)-1], 100*float64(over15)/float64(len(fns)))
	ok := true
	byLen := append([]fn(nil), fns...)
	sort.SliceStable(byLen, func(i, j int) bool { return byLen[i].lines > byLen[j].lines })
	for _, f := range byLen {
		if f.lines > maxLines || f.complexity > maxCx {
			fmt.Fprintf(w, "  OVER  %-60s %4d lines  complexity %3d  (%s)\n", f.name, f.lines, f.complexity, f.pos)
			ok = false
		}
	}
	for i, f := range byLen {
		if i == top {
			break
		}
		fmt.Fprintf(w, "  top   %-60s %4d lines  complexity %3d  (%s)\n", f.name, f.lines, f.complexity, f.pos)
	}
	if p90 > maxP90 {
		fmt.Fprintf(w, "funcsize: p90 length %d is over %d\n", p90, maxP90)
		ok = false
	}
	if !ok {
		fmt.Fprintf(w, "funcsize: FAIL (limits: %d lines, complexity %d, p90 %d)\n", maxLines, maxCx, maxP90)
	} else {
		fmt.Fprintf(w, "funcsize: ok (limits: %d lines, complexity %d, p90 %d)\n", maxLines, maxCx, maxP90)
	}
	return ok
}
