package driver_test

import (
	"errors"
	"fmt"

	"github.com/tokensem/tokensem"
	"github.com/tokensem/tokensem/driver"
)

func ExampleCodec() {
	codec := driver.NewCodec([]byte("a shared secret of 16+ bytes"))
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
	forged, _ := driver.NewCodec([]byte("an attacker's guess at the key")).Encode(tok)
	_, err = codec.Decode(forged)
	fmt.Println(errors.Is(err, tokensem.ErrForgedToken))

	// Output:
	// orders[3]@1 <nil>
	// true
}
