package replicate

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Sealed messages. With a cluster key configured, every message (batch,
// sync request, sync reply) is the wire message of wire.go sealed with
// AES-256-GCM:
//
//	sealed = magic "RS" · version (1 byte, 1) · key id (4 bytes) · nonce (12 bytes)
//	         · AES-256-GCM(plaintext = wire message, additional data = ad)
//	ad     = the first 7 bytes above · kind (1 byte) · subject prefix
//
// The key id, the first 4 bytes of SHA-256 of a fixed label and the key,
// picks the key to open with, so that two configured keys (current and
// previous, during a rotation) cost one attempt, not two. The kind in the
// additional data binds a message to its use: a captured batch does not
// open as a sync reply or request, and the prefix binds it to its cluster.
// The nonce is random: AES-GCM stays safe for about 2^32 messages per key,
// decades of batches at ten a second per node.

// KeySize is the length of a cluster key: 32 bytes (AES-256).
const KeySize = 32

const (
	keyIDLen     = 4
	nonceLen     = 12
	sealedHeader = 3 + keyIDLen + nonceLen
	sealOverhead = sealedHeader + 16 // + the GCM tag
)

var sealedMagic = [2]byte{'R', 'S'}

// Errors of opening a sealed message; each means it is dropped.
var (
	// errUnsealed: a key is configured but the message is not sealed.
	errUnsealed = errors.New("replicate: message not sealed with a cluster key")
	// errUnknownKey: sealed with a key this node does not hold.
	errUnknownKey = errors.New("replicate: message sealed with an unknown key")
	// errUnauthentic: the key id matched but the message does not open
	// (altered, truncated, sealed for another kind or cluster, or forged).
	errUnauthentic = errors.New("replicate: message does not authenticate")
)

// sealKey is one cluster key, ready to use.
type sealKey struct {
	id   [keyIDLen]byte
	aead cipher.AEAD
}

// sealer seals with the first of its keys and opens with any of them. A
// nil *sealer seals nothing (no key configured). It is safe for
// concurrent use (cipher.AEAD from crypto/aes is).
type sealer struct {
	keys   []sealKey
	prefix string
}

func newSealer(keys [][]byte, prefix string) (*sealer, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if len(keys) > 2 {
		return nil, fmt.Errorf("replicate: %d cluster keys, at most 2 (current and previous)", len(keys))
	}
	s := &sealer{prefix: prefix}
	for i, k := range keys {
		if len(k) != KeySize {
			return nil, fmt.Errorf("replicate: cluster key %d is %d bytes, want %d", i+1, len(k), KeySize)
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, fmt.Errorf("replicate: cluster key %d: %w", i+1, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("replicate: cluster key %d: %w", i+1, err)
		}
		sk := sealKey{id: KeyID(k), aead: aead}
		for _, o := range s.keys {
			if o.id == sk.id {
				return nil, errors.New("replicate: the two cluster keys are the same key")
			}
		}
		s.keys = append(s.keys, sk)
	}
	return s, nil
}

// KeyID is the public id of a cluster key: what a sealed message carries
// in clear to say which key opens it (logged at start to check that the
// nodes share a key without showing it).
func KeyID(key []byte) [keyIDLen]byte {
	h := sha256.New()
	h.Write([]byte("ratelimit-authz cluster key id\x00"))
	h.Write(key)
	var id [keyIDLen]byte
	copy(id[:], h.Sum(nil))
	return id
}

// ad appends the additional data of a message of kind sealed under hdr.
func (s *sealer) ad(dst, hdr []byte, kind msgKind) []byte {
	dst = append(dst, hdr[:3+keyIDLen]...)
	dst = append(dst, byte(kind))
	return append(dst, s.prefix...)
}

// seal appends to dst the sealed form of the wire message msg of kind.
func (s *sealer) seal(dst, msg []byte, kind msgKind, adBuf *[]byte) []byte {
	k := &s.keys[0]
	start := len(dst)
	dst = append(dst, sealedMagic[0], sealedMagic[1], 1)
	dst = append(dst, k.id[:]...)
	var nonce [nonceLen]byte
	rand.Read(nonce[:]) // never fails (crypto/rand)
	dst = append(dst, nonce[:]...)
	*adBuf = s.ad((*adBuf)[:0], dst[start:], kind)
	return k.aead.Seal(dst, nonce[:], msg, *adBuf)
}

// open appends to dst the wire message that data seals for kind.
func (s *sealer) open(dst, data []byte, kind msgKind, adBuf *[]byte) ([]byte, error) {
	if len(data) < 3 || data[0] != sealedMagic[0] || data[1] != sealedMagic[1] {
		return nil, errUnsealed
	}
	if data[2] != 1 {
		return nil, fmt.Errorf("%w: sealed format version %d", errVersion, data[2])
	}
	if len(data) < sealOverhead {
		return nil, fmt.Errorf("%w: %d bytes", errUnauthentic, len(data))
	}
	id := data[3 : 3+keyIDLen]
	for i := range s.keys {
		k := &s.keys[i]
		if !bytes.Equal(k.id[:], id) {
			continue
		}
		*adBuf = s.ad((*adBuf)[:0], data, kind)
		out, err := k.aead.Open(dst, data[3+keyIDLen:sealedHeader], data[sealedHeader:], *adBuf)
		if err != nil {
			return nil, errUnauthentic
		}
		return out, nil
	}
	return nil, errUnknownKey
}

// isSealed reports whether data looks like a sealed message.
func isSealed(data []byte) bool {
	return len(data) >= 2 && data[0] == sealedMagic[0] && data[1] == sealedMagic[1]
}

// ParseKey reads a cluster key written as 64 hex digits or as base64
// (standard or URL alphabet, padded or not) of exactly 32 bytes. Leading
// and trailing white space is ignored.
func ParseKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("empty cluster key")
	}
	if len(s) == 2*KeySize {
		if k, err := hex.DecodeString(s); err == nil {
			return k, nil
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(s); err == nil {
			if len(k) != KeySize {
				return nil, fmt.Errorf("cluster key decodes to %d bytes, want %d (generate one with: openssl rand -base64 32)", len(k), KeySize)
			}
			return k, nil
		}
	}
	return nil, fmt.Errorf("cluster key of %d characters is neither 64 hex digits nor base64 of %d bytes (generate one with: openssl rand -base64 32)", len(s), KeySize)
}

// ParseKeys reads one or two cluster keys, separated by a comma or a new
// line (blank lines and lines starting with # are ignored): the first
// seals and both open, so that a key rotates without downtime.
func ParseKeys(s string) ([][]byte, error) {
	var keys [][]byte
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, f := range strings.Split(line, ",") {
			k, err := ParseKey(f)
			if err != nil {
				return nil, fmt.Errorf("key %d: %w", len(keys)+1, err)
			}
			for _, o := range keys {
				if bytes.Equal(o, k) {
					return nil, errors.New("the same key is given twice")
				}
			}
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no cluster key")
	}
	if len(keys) > 2 {
		return nil, fmt.Errorf("%d cluster keys, at most 2 (current, then previous)", len(keys))
	}
	return keys, nil
}
