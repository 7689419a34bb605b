package tokensem_test

import (
	"errors"
	"fmt"

	"github.com/tokensem/tokensem"
)

func ExampleValidateName() {
	for _, name := range []string{"orders", "tenant-42", "-orders", "a.b", ""} {
		err := tokensem.ValidateName(name)
		fmt.Printf("%q valid=%v\n", name, !errors.Is(err, tokensem.ErrInvalidName))
	}
	// Output:
	// "orders" valid=true
	// "tenant-42" valid=true
	// "-orders" valid=false
	// "a.b" valid=false
	// "" valid=false
}
