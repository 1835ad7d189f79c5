package lockset

import (
	"encoding/binary"
	"errors"
)

// errMalformed is Decode's error for bytes Encode did not write.
var errMalformed = errors.New("lockhooks: malformed lock request")

// Encode packs a request: the try flag, the namespace, then the canonical
// ids, each length-prefixed.
func Encode(namespace string, ids []string, try bool) []byte {
	b := []byte{0}
	if try {
		b[0] = 1
	}
	b = binary.AppendUvarint(b, uint64(len(namespace)))
	b = append(b, namespace...)
	for _, k := range ids {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	return b
}

// Decode unpacks what Encode wrote. Bytes too short for their length
// prefixes, or an empty id, are an error; a first byte other than 1 reads
// as "not try", and a length prefix may be written with more bytes than
// Encode uses: what decodes is read as it decodes.
func Decode(b []byte) (namespace string, ids []string, try bool, err error) {
	if len(b) < 1 {
		return "", nil, false, errMalformed
	}
	try, b = b[0] == 1, b[1:]
	next := func() (string, bool) {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			return "", false
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, true
	}
	var ok bool
	if namespace, ok = next(); !ok {
		return "", nil, false, errMalformed
	}
	for len(b) > 0 {
		k, ok := next()
		if !ok || k == "" {
			return "", nil, false, errMalformed
		}
		ids = append(ids, k)
	}
	return namespace, ids, try, nil
}
