package tokensem_test

import (
	"errors"
	"fmt"

	"github.com/tokensem/tokensem"
)

func ExampleCodec() {
	codec := tokensem.NewCodec([]byte("a shared secret of 16+ bytes"))
	tok := tokensem.Token{
		Semaphore: "orders",
		Index:     3,
		Epoch:     1,
		ID:        "00112233445566778899aabbccddeeff", // normally from NewToken
	}
	wire, err := codec.Encode(tok)
	if err != nil {
		fmt.Println(err)
		return
	}
	got, err := codec.Decode(wire)
	fmt.Println(got, err)

	// A token signed with another key is refused.
	forged, _ := tokensem.NewCodec([]byte("an attacker's guess at the key")).Encode(tok)
	_, err = codec.Decode(forged)
	fmt.Println(errors.Is(err, tokensem.ErrForgedToken))

	// Output:
	// orders[3]@1 <nil>
	// true
}

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
