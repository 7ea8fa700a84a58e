// Prints request keys computed with Go's hash/fnv, fxamacker/cbor (canonical) and cespare/xxhash,
// following llm-d-router's pkg/kvcache/kvblock/token_processor.go (ebab687), as JSON test vectors.
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"

	"github.com/cespare/xxhash/v2"
	"github.com/fxamacker/cbor/v2"
)

type MMHash struct{ Hash string }

var enc, _ = cbor.CanonicalEncOptions().EncMode()

func fnvHash(parent uint64, tokens []uint32, extra interface{}) uint64 {
	b, err := enc.Marshal([]interface{}{parent, tokens, extra})
	if err != nil {
		panic(err)
	}
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

func xxh(parent uint64, tokens []uint32, extras []MMHash) uint64 {
	d := xxhash.New()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], parent)
	d.Write(buf[:])
	for _, t := range tokens {
		var tb [4]byte
		binary.LittleEndian.PutUint32(tb[:], t)
		d.Write(tb[:])
	}
	for _, m := range extras {
		binary.LittleEndian.PutUint64(buf[:], uint64(len(m.Hash)))
		d.Write(buf[:])
		d.WriteString(m.Hash)
	}
	return d.Sum64()
}

type Case struct {
	Algorithm string     `json:"algorithm"`
	Seed      string     `json:"seed"`
	Model     string     `json:"model"`
	BlockSize int        `json:"block_size"`
	Tokens    []uint32   `json:"tokens"`
	Extra     [][]string `json:"extra"`
	Keys      []string   `json:"keys"` // decimal uint64
}

func keys(alg, seed, model string, bs int, tokens []uint32, extra [][]string) []string {
	var prev uint64
	if alg == "xxh64" {
		prev = xxh(xxhash.Sum64String(seed), nil, []MMHash{{Hash: model}})
	} else {
		h := fnv.New64a()
		h.Write([]byte(seed))
		prev = fnvHash(h.Sum64(), nil, model)
	}
	var out []string
	for i := 0; i+bs <= len(tokens); i += bs {
		var mm []MMHash
		if extra != nil && i/bs < len(extra) && extra[i/bs] != nil {
			for _, s := range extra[i/bs] {
				mm = append(mm, MMHash{Hash: s})
			}
		}
		if alg == "xxh64" {
			prev = xxh(prev, tokens[i:i+bs], mm)
		} else {
			prev = fnvHash(prev, tokens[i:i+bs], mm)
		}
		out = append(out, fmt.Sprintf("%d", prev))
	}
	return out
}

func main() {
	var cases []Case
	big := make([]uint32, 48)
	for i := range big {
		big[i] = uint32(i*7919 + 1) // past one byte, two bytes
	}
	big[5] = 4294967295
	big[6] = 65536
	big[7] = 23
	big[8] = 24
	for _, alg := range []string{"cbor-fnv", "xxh64"} {
		for _, seed := range []string{"", "42"} {
			for _, model := range []string{"Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct"} {
				cases = append(cases, Case{alg, seed, model, 16, big, nil, keys(alg, seed, model, 16, big, nil)})
			}
		}
		ex := [][]string{{"salt-abc"}, nil, {"mm-1", "<&>"}}
		cases = append(cases, Case{alg, "7", "m", 16, big, ex, keys(alg, "7", "m", 16, big, ex)})
		small := []uint32{1, 2, 3, 4, 5}
		cases = append(cases, Case{alg, "", "m", 2, small, nil, keys(alg, "", "m", 2, small, nil)})
	}
	json.NewEncoder(os.Stdout).Encode(cases)
}
