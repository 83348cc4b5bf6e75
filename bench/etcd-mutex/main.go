// etcd-mutex: lock/unlock cycles with etcd's own lock recipe (clientv3/concurrency.Mutex), the
// reference row of `dlock bench lock`. Each client has one concurrency.Session (one lease, kept
// alive in the background) and loops Lock → Unlock on its own key (distinct) or on one shared key
// (contended) for the measured time, after a 1 s warm-up. Prints one JSON line:
// {"cycles":N,"seconds":S,"p50_us":…,"p99_us":…,"max_us":…} with the latency of Lock (max_us: the
// longest wait).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

type result struct {
	Cycles  int     `json:"cycles"`
	Seconds float64 `json:"seconds"`
	P50us   int64   `json:"p50_us"`
	P99us   int64   `json:"p99_us"`
	MaxUs   int64   `json:"max_us"`
}

func main() {
	endpoints := flag.String("endpoints", "http://127.0.0.1:2379", "comma-separated etcd client URLs")
	clients := flag.Int("clients", 16, "concurrent clients")
	seconds := flag.Float64("seconds", 10, "measured seconds (after a 1 s warm-up)")
	contended := flag.Bool("contended", false, "all clients lock one key")
	prefix := flag.String("prefix", "/bench-mutex/", "key prefix")
	flag.Parse()

	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	defer cli.Close()

	warmUntil := time.Now().Add(time.Second)
	stopAt := warmUntil.Add(time.Duration(*seconds * float64(time.Second)))
	var mu sync.Mutex
	var lat []int64
	var wg sync.WaitGroup
	errs := make(chan error, *clients)
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			key := fmt.Sprintf("%sk%d", *prefix, i)
			if *contended {
				key = *prefix + "hot"
			}
			m := concurrency.NewMutex(s, key)
			var mine []int64
			for {
				t0 := time.Now()
				if !t0.Before(stopAt) {
					break
				}
				if err := m.Lock(context.Background()); err != nil {
					errs <- err
					return
				}
				took := time.Since(t0)
				if err := m.Unlock(context.Background()); err != nil {
					errs <- err
					return
				}
				if !t0.Before(warmUntil) {
					mine = append(mine, took.Microseconds())
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	q := func(p float64) int64 {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(p*float64(len(lat)-1))]
	}
	out, _ := json.Marshal(result{Cycles: len(lat), Seconds: *seconds, P50us: q(0.50), P99us: q(0.99), MaxUs: q(1.0)})
	fmt.Println(string(out))
}
