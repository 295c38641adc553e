package envoyconfig_test

import (
	"fmt"
	"log"

	"github.com/edgelimit/edgelimit/envoy/envoyconfig"
)

// Load the deployed bootstrap and point it at local processes, as
// build/gateway does with its -listen, -cluster and -wasm flags.
func ExampleConfig_Override() {
	c, err := envoyconfig.Load("../../envoy/envoy.yaml")
	if err != nil {
		log.Fatal(err)
	}
	err = c.Override("127.0.0.1:18000", map[string]string{"ratelimit_sidecar": "127.0.0.1:18081"}, "build/filter.wasm")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listen", c.Listener, "admin", c.Admin)
	for _, r := range c.Routes {
		fmt.Println("route", r.Prefix, "→", r.Cluster, c.Clusters[r.Cluster].Endpoints)
	}
	fmt.Println("sidecar", c.Clusters["ratelimit_sidecar"].Endpoints)
	fmt.Println("wasm", c.Wasm.RootID, c.Wasm.Filename, "fail_open", c.Wasm.FailOpen)
	// Output:
	// listen 127.0.0.1:18000 admin 127.0.0.1:9901
	// route /orders → orders [127.0.0.1:9001]
	// route /billing → billing [127.0.0.1:9002]
	// sidecar [127.0.0.1:18081]
	// wasm edge_ratelimit build/filter.wasm fail_open true
}
