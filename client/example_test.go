package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
)

func ExampleClient_Do() {
	// An in-process store stands in for an idem cluster here.
	srv, err := idemtest.Start(idemtest.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	c, err := client.New(client.DefaultConfig(srv.Addr()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	key := client.NewKey() // once per logical operation, reused by its retries
	charge := func(ctx context.Context, l client.Lease) (client.Response, error) {
		fmt.Println("charging, fencing token", l.FencingToken)
		return client.Response{Status: 201, Body: []byte("charge ch_1")}, nil
	}
	for range 2 {
		res, err := c.Do(context.Background(), "payments", key, charge, client.WithFingerprint("POST /charges amount=100"))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%d %s replayed=%v\n", res.Response.Status, res.Response.Body, res.Replayed)
	}
	// Output:
	// charging, fencing token 1
	// 201 charge ch_1 replayed=false
	// 201 charge ch_1 replayed=true
}
