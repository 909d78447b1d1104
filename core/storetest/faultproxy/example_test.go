package faultproxy_test

import (
	"bufio"
	"fmt"
	"net"

	"github.com/idemgo/idem/core/storetest/faultproxy"
)

// Example cuts a connection at the first chunk that carries "COMMIT",
// before the server sees it.
func Example() {
	server, _ := net.Listen("tcp", "127.0.0.1:0")
	defer server.Close()
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "ok %s", line)
			}()
		}
	}()
	proxy, _ := faultproxy.New(server.Addr().String())
	defer proxy.Close()
	fired := proxy.CutOn([]byte("COMMIT"), faultproxy.Before)

	for _, stmt := range []string{"SELECT 1\n", "COMMIT\n"} {
		c, _ := net.Dial("tcp", proxy.Addr())
		fmt.Fprint(c, stmt)
		answer, err := bufio.NewReader(c).ReadString('\n')
		fmt.Printf("%q %v\n", answer, err != nil)
		c.Close()
	}
	<-fired
	fmt.Println("cuts:", proxy.Cuts())
	// Output:
	// "ok SELECT 1\n" false
	// "" true
	// cuts: 1
}
