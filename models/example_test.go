package models_test

import (
	"fmt"

	"github.com/memplan/memplan/models"
)

func ExampleLookup() {
	a, err := models.Lookup("gpt2")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(a.Family, a.Layers, a.Hidden, a.ParamCount())
	// Output: gpt2 12 768 124439808
}

func ExampleLookup_unknown() {
	_, err := models.Lookup("lama-2-7b")
	fmt.Println(err)
	// Output: unknown model "lama-2-7b"; did you mean llama-2-7b, llama-2-70b, llama-2-13b?
}
