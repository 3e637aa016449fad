package units_test

import (
	"fmt"

	"github.com/memplan/memplan/units"
)

func ExampleParseBytes() {
	b, _ := units.ParseBytes("24GiB")
	fmt.Println(int64(b), b)
	fmt.Println(units.BF16.Size(7_000_000_000))
	// Output:
	// 25769803776 24.00 GiB
	// 13.04 GiB
}
