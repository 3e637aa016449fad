package snapshot

import (
	"errors"
	"fmt"
	"io"
)

// tlScanner reads the JSON a memory timeline is made of (arrays of
// integers, nested two deep) from a stream, one number at a time, so that
// reading a timeline holds its points and a 64 KiB buffer, never the text.
type tlScanner struct {
	r        io.Reader
	buf      []byte
	pos, end int
	read     int64 // bytes read from r
	gzipped  bool
	err      error // the first error of r other than io.EOF, or of the bound
	eof      bool
}

// errTooLarge is the bound's error; the caller names the file.
var errTooLarge = fmt.Errorf("the memory timeline is larger than %d MiB, more than torch.profiler writes for %d time points (the most memplan reads)", maxTimelineBytes>>20, maxTimelinePoints)

func newScanner(r io.Reader, gzipped bool) *tlScanner {
	return &tlScanner{r: r, buf: make([]byte, 64<<10), gzipped: gzipped}
}

// fill reads more data; false at the end or on an error (s.err).
func (s *tlScanner) fill() bool {
	for !s.eof && s.err == nil {
		n, err := s.r.Read(s.buf)
		s.pos, s.end = 0, n
		s.read += int64(n)
		if s.read > maxTimelineBytes {
			s.err = errTooLarge
			return false
		}
		if err == io.EOF {
			s.eof = true
		} else if err != nil {
			s.err = err
			if s.gzipped {
				s.err = fmt.Errorf("gzipped memory timeline: %v", err)
			}
		}
		if n > 0 {
			return true
		}
	}
	return false
}

// peek is the next byte that is not JSON whitespace, left unread; ok is
// false at the end of the data (err says why when it is not the end).
func (s *tlScanner) peek() (c byte, ok bool, err error) {
	for {
		for s.pos < s.end {
			switch c := s.buf[s.pos]; c {
			case ' ', '\t', '\n', '\r':
				s.pos++
			default:
				return c, true, nil
			}
		}
		if !s.fill() {
			return 0, false, s.err
		}
	}
}

func syntaxErr(format string, a ...any) error {
	return fmt.Errorf("not a torch.profiler memory timeline: "+format, a...)
}

// next is the next byte that is not whitespace; the end of the data is an
// error saying what was expected.
func (s *tlScanner) next(want string) (byte, error) {
	c, ok, err := s.peek()
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, syntaxErr("the data ends where %s should be (truncated?)", want)
	}
	return c, nil
}

// array reads the elements of a JSON array whose '[' is read, calling item
// with the scanner at each element's first byte, and consumes the ']'.
func (s *tlScanner) array(what string, item func(i int) error) (int, error) {
	for i := 0; ; i++ {
		c, err := s.next("the rest of " + what)
		if err != nil {
			return i, err
		}
		if c == ']' && i == 0 {
			s.pos++
			return 0, nil
		}
		if i > 0 {
			switch c {
			case ']':
				s.pos++
				return i, nil
			case ',':
				s.pos++
			default:
				return i, syntaxErr("%s: want , or ] after item %d, got %s", what, i-1, s.token())
			}
			if c, err = s.next("item " + fmt.Sprint(i) + " of " + what); err != nil {
				return i, err
			}
			if c == ']' {
				return i, syntaxErr("%s: a comma before ]", what)
			}
		}
		if err := item(i); err != nil {
			return i, err
		}
	}
}

// open reads the '[' that starts an array.
func (s *tlScanner) open(what string) error {
	c, err := s.next(what)
	if err != nil {
		return err
	}
	if c != '[' {
		return fmt.Errorf("%s: want an array of integers, got %s", what, s.token())
	}
	s.pos++
	return nil
}

// ints reads an array of integers whose '[' is read, calling each with
// every item.
func (s *tlScanner) ints(what string, each func(i int, v int64) error) (int, error) {
	return s.array(what, func(i int) error {
		v, err := s.integer(what, i)
		if err != nil {
			return err
		}
		return each(i, v)
	})
}

// integer reads a JSON integer that fits an int64.
func (s *tlScanner) integer(what string, i int) (int64, error) {
	var u uint64
	neg, digits := false, 0
	for {
		if s.pos == s.end && !s.fill() {
			if s.err != nil {
				return 0, s.err
			}
			break
		}
		c := s.buf[s.pos]
		if c == '-' && digits == 0 && !neg {
			neg = true
		} else if c >= '0' && c <= '9' && !(digits == 1 && u == 0) && u <= (1<<63)/10 {
			u = u*10 + uint64(c-'0')
			digits++
		} else {
			break
		}
		s.pos++
	}
	c, ok, _ := s.peekRaw()
	end := !ok || isDelim(c)
	if digits == 0 || !end || u > 1<<63 || (u == 1<<63 && !neg) {
		return 0, fmt.Errorf("%s, item %d: %s is not an integer", what, i, s.tokenFrom(digits, neg, u))
	}
	if neg {
		return -int64(u-1) - 1, nil
	}
	return int64(u), nil
}

// peekRaw is the next byte, whitespace or not.
func (s *tlScanner) peekRaw() (byte, bool, error) {
	if s.pos == s.end && !s.fill() {
		return 0, false, s.err
	}
	return s.buf[s.pos], true, nil
}

// tokenFrom is the text of a bad number for a message: the digits read so
// far (u, with its sign) and what follows them.
func (s *tlScanner) tokenFrom(digits int, neg bool, u uint64) string {
	var head string
	if neg {
		head = "-"
	}
	if digits > 0 {
		head += fmt.Sprint(u)
	}
	if c, ok, _ := s.peekRaw(); head != "" && (!ok || isDelim(c)) {
		return head
	}
	return truncate(head + s.token())
}

// token is the text of the token at the scanner, for a message: a string
// with its quotes, else up to the next delimiter; at most 40 bytes.
func (s *tlScanner) token() string {
	var t []byte
	inString := false
	for len(t) < 40 {
		c, ok, _ := s.peekRaw()
		if !ok {
			break
		}
		if !inString && len(t) > 0 && (isDelim(c) || c == '}') {
			break
		}
		t = append(t, c)
		s.pos++
		if c == '"' {
			if inString {
				break
			}
			inString = len(t) == 1
		}
		if !inString && (c == '[' || c == '{') {
			break
		}
	}
	if len(t) == 0 {
		return "the end of the data"
	}
	return truncate(string(t))
}

// atEnd refuses anything but whitespace after the timeline's array.
func (s *tlScanner) atEnd() error {
	_, ok, err := s.peek()
	switch {
	case err != nil:
		return err
	case ok:
		return syntaxErr("more data after the timeline's array: %s", s.token())
	}
	return nil
}

var errNoEvents = errors.New("the memory timeline has no events")

// isDelim says whether c ends a number: a separator, a ] or whitespace.
func isDelim(c byte) bool {
	return c == ',' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r'
}
