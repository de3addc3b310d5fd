package replicate

import (
	"strings"
	"testing"
)

// FuzzParseKeys: whatever a key file or RATELIMIT_AUTHZ_CLUSTER_KEY holds,
// ParseKeys returns one or two distinct 32-byte keys or an error, and the
// error never repeats the text (a mistyped key is still a secret).
func FuzzParseKeys(f *testing.F) {
	hexKey := strings.Repeat("ab", KeySize)
	b64Key := "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
	for _, s := range []string{
		hexKey, b64Key, hexKey + "," + b64Key, "# rotation\n" + hexKey + "\n\n" + b64Key + "\n",
		hexKey + "," + hexKey, hexKey + "," + b64Key + "," + hexKey, "", "#", hexKey[:63], hexKey + "0",
		strings.Repeat("=", 44), "\xff\xfe" + hexKey, b64Key[:43],
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		keys, err := ParseKeys(s)
		if err != nil {
			if secret := strings.TrimSpace(s); len(secret) >= 16 && strings.Contains(err.Error(), secret) {
				t.Fatalf("error %q repeats the key text", err)
			}
			return
		}
		if len(keys) < 1 || len(keys) > 2 {
			t.Fatalf("%d keys", len(keys))
		}
		for _, k := range keys {
			if len(k) != KeySize {
				t.Fatalf("key of %d bytes", len(k))
			}
		}
		if len(keys) == 2 && string(keys[0]) == string(keys[1]) {
			t.Fatal("the same key twice")
		}
	})
}
