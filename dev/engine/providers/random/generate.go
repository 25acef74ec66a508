package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"sort"

	"golang.org/x/crypto/bcrypt"
)

const (
	numChars     = "0123456789"
	lowerChars   = "abcdefghijklmnopqrstuvwxyz"
	upperChars   = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	specialChars = "!@#$%&*()-_=+[]{}<>:?"
)

func num(v any) int64 { f, _ := v.(float64); return int64(f) }
func flag(v any) bool { b, _ := v.(bool); return b }

// randomString draws, from crypto/rand, each class's minimum from that class, the rest from
// the union of the enabled classes, then shuffles the whole: terraform-provider-random's rule.
// overrideSpecial replaces the special set (used only when special is true).
func randomString(plan map[string]any) (string, error) {
	special := specialChars
	if s, _ := plan["overrideSpecial"].(string); s != "" {
		special = s
	}
	set := ""
	for _, c := range []struct {
		on    string
		chars string
	}{{"upper", upperChars}, {"lower", lowerChars}, {"numeric", numChars}, {"special", special}} {
		if flag(plan[c.on]) {
			set += c.chars
		}
	}
	if set == "" {
		return "", errors.New("the character set specified is empty")
	}
	length := num(plan["length"])
	out := make([]rune, 0, length)
	// the minimums apply whether or not the class is enabled, as upstream
	for _, m := range []struct {
		min   string
		chars string
	}{{"minNumeric", numChars}, {"minLower", lowerChars}, {"minUpper", upperChars}, {"minSpecial", special}} {
		rs, err := draw(m.chars, num(plan[m.min]))
		if err != nil {
			return "", err
		}
		out = append(out, rs...)
	}
	rest, err := draw(set, length-int64(len(out)))
	if err != nil {
		return "", err
	}
	out = append(out, rest...)
	keys := make([]byte, len(out))
	if _, err := rand.Read(keys); err != nil {
		return "", err
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return keys[idx[a]] < keys[idx[b]] })
	shuffled := make([]rune, len(out))
	for i, j := range idx {
		shuffled[i] = out[j]
	}
	return string(shuffled), nil
}

func draw(chars string, n int64) ([]rune, error) {
	if n <= 0 {
		return nil, nil
	}
	set := []rune(chars)
	if len(set) == 0 {
		return nil, errors.New("charSet is empty")
	}
	out := make([]rune, n)
	for i := range out {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(len(set))))
		if err != nil {
			return nil, err
		}
		out[i] = set[k.Int64()]
	}
	return out, nil
}

// bcryptHash hashes the first 72 bytes (bcrypt's limit), at bcrypt's default cost, as upstream.
func bcryptHash(s string) (string, error) {
	b := []byte(s)
	if len(b) > 72 {
		b = b[:72]
	}
	h, err := bcrypt.GenerateFromPassword(b, bcrypt.DefaultCost)
	return string(h), err
}

// randomID: byteLength random bytes; the id is their unpadded URL-safe base64 without the
// prefix, and every output is prefix + an encoding.
func randomID(plan map[string]any) (map[string]any, error) {
	n := num(plan["byteLength"])
	b := make([]byte, n)
	if got, err := rand.Read(b); int64(got) != n || err != nil {
		return nil, fmt.Errorf("random id: read %d of %d random bytes: %v", got, n, err)
	}
	prefix, _ := plan["prefix"].(string)
	id := base64.RawURLEncoding.EncodeToString(b)
	return map[string]any{
		"__id":   id,
		"b64Url": prefix + id,
		"b64Std": prefix + base64.StdEncoding.EncodeToString(b),
		"hex":    prefix + hex.EncodeToString(b),
		"dec":    prefix + new(big.Int).SetBytes(b).String(),
	}, nil
}
