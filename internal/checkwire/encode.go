package checkwire

import (
	"math"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"
)

// The hand encoder of the CheckResponses this product builds: status,
// a denied response (HTTP status, headers, body) or an OK response
// (response headers to add), and dynamic metadata. It writes what
// proto.MarshalOptions{Deterministic: true} writes (the tests compare the
// bytes), without reflection and in one allocation. A message setting
// anything else (unknown fields, status details, an error response, other
// OK-response fields, a header's raw value or deprecated append, a map
// too large to sort in place) is left to the standard codec, and so is a
// string that is not valid UTF-8 (which the standard codec refuses, as
// proto3 requires): Encodable reports it.

// maxSortedEntries bounds the Struct maps sorted in place (quadratic, no
// allocation); larger ones take the standard codec.
const maxSortedEntries = 16

// maxStructDepth bounds the dynamic metadata nesting encoded by hand.
const maxStructDepth = 16

// unknown reports whether m carries unknown fields (which only the
// standard codec writes).
func unknown(m protoreflect.ProtoMessage) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

// Encodable reports whether the hand encoder writes m.
func Encodable(m *authv3.CheckResponse) bool {
	if unknown(m) {
		return false
	}
	if st := m.Status; st != nil && (len(st.Details) > 0 || unknown(st) || !utf8.ValidString(st.Message)) {
		return false
	}
	switch r := m.GetHttpResponse().(type) {
	case nil:
	case *authv3.CheckResponse_DeniedResponse:
		d := r.DeniedResponse
		if d == nil || unknown(d) || (d.Status != nil && unknown(d.Status)) || !utf8.ValidString(d.Body) || !headersEncodable(d.Headers) {
			return false
		}
	case *authv3.CheckResponse_OkResponse:
		ok := r.OkResponse
		if ok == nil || unknown(ok) || len(ok.Headers) > 0 || len(ok.HeadersToRemove) > 0 || ok.DynamicMetadata != nil ||
			len(ok.QueryParametersToSet) > 0 || len(ok.QueryParametersToRemove) > 0 || !headersEncodable(ok.ResponseHeadersToAdd) {
			return false
		}
	default:
		return false
	}
	return m.DynamicMetadata == nil || structEncodable(m.DynamicMetadata, 0)
}

func headersEncodable(hs []*corev3.HeaderValueOption) bool {
	for _, h := range hs {
		if h == nil || h.Append != nil || h.Header == nil || len(h.Header.RawValue) > 0 || unknown(h) || unknown(h.Header) ||
			!utf8.ValidString(h.Header.Key) || !utf8.ValidString(h.Header.Value) {
			return false
		}
	}
	return true
}

func structEncodable(s *structpb.Struct, depth int) bool {
	if depth > maxStructDepth || len(s.Fields) > maxSortedEntries || unknown(s) {
		return false
	}
	for k, v := range s.Fields {
		if !utf8.ValidString(k) || !valueEncodable(v, depth) {
			return false
		}
	}
	return true
}

func valueEncodable(v *structpb.Value, depth int) bool {
	if v == nil || unknown(v) {
		return false
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return utf8.ValidString(k.StringValue)
	case *structpb.Value_NullValue, *structpb.Value_NumberValue, *structpb.Value_BoolValue:
		return true
	case *structpb.Value_StructValue:
		return k.StructValue != nil && structEncodable(k.StructValue, depth+1)
	case *structpb.Value_ListValue:
		if k.ListValue == nil || unknown(k.ListValue) {
			return false
		}
		for _, e := range k.ListValue.Values {
			if e == nil || !valueEncodable(e, depth+1) {
				return false
			}
		}
		return true
	}
	return false // a Value without a kind
}

func sizeMsg(n int) int { return protowire.SizeVarint(uint64(n)) + n }

func appendMsgHeader(b []byte, num protowire.Number, n int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.BytesType), uint64(n))
}

func sizeString(s string) int {
	if s == "" {
		return 0
	}
	return 1 + sizeMsg(len(s))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func sizeVarintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// Field numbers (every one below 16: one-byte tags).
const (
	fResponseStatus   = 1
	fResponseDenied   = 2
	fResponseOK       = 3
	fResponseMetadata = 4

	fStatusCode    = 1
	fStatusMessage = 2

	fDeniedStatus  = 1
	fDeniedHeaders = 2
	fDeniedBody    = 3
	fHTTPCode      = 1

	fOKResponseHeadersToAdd = 6

	fOptionHeader    = 1
	fOptionAction    = 3
	fOptionKeepEmpty = 4
	fHeaderKey       = 1
	fHeaderValue     = 2

	fStructFields = 1
	fEntryKey     = 1
	fEntryValue   = 2
	fValueNull    = 1
	fValueNumber  = 2
	fValueString  = 3
	fValueBool    = 4
	fValueStruct  = 5
	fValueList    = 6
	fListValues   = 1
)

// ResponseSize is the length of m's encoding (m Encodable).
func ResponseSize(m *authv3.CheckResponse) int {
	n := 0
	if st := m.Status; st != nil {
		n += 1 + sizeMsg(sizeVarintField(uint64(int64(st.Code)))+sizeString(st.Message))
	}
	switch r := m.HttpResponse.(type) {
	case *authv3.CheckResponse_DeniedResponse:
		n += 1 + sizeMsg(sizeDenied(r.DeniedResponse))
	case *authv3.CheckResponse_OkResponse:
		n += 1 + sizeMsg(sizeOptions(r.OkResponse.ResponseHeadersToAdd))
	}
	if md := m.DynamicMetadata; md != nil {
		n += 1 + sizeMsg(sizeStruct(md))
	}
	return n
}

// AppendResponse appends the encoding of m (Encodable) to b: what
// proto.MarshalOptions{Deterministic: true} writes.
func AppendResponse(b []byte, m *authv3.CheckResponse) []byte {
	if st := m.Status; st != nil {
		b = appendMsgHeader(b, fResponseStatus, sizeVarintField(uint64(int64(st.Code)))+sizeString(st.Message))
		// int32 is sign-extended on the wire, as the runtime writes it.
		b = appendVarintField(b, fStatusCode, uint64(int64(st.Code)))
		b = appendString(b, fStatusMessage, st.Message)
	}
	// The runtime writes a oneof after the other fields; so does this.
	if md := m.DynamicMetadata; md != nil {
		b = appendMsgHeader(b, fResponseMetadata, sizeStruct(md))
		b = appendStruct(b, md)
	}
	switch r := m.HttpResponse.(type) {
	case *authv3.CheckResponse_DeniedResponse:
		d := r.DeniedResponse
		b = appendMsgHeader(b, fResponseDenied, sizeDenied(d))
		if d.Status != nil {
			b = appendMsgHeader(b, fDeniedStatus, sizeVarintField(uint64(d.Status.Code)))
			b = appendVarintField(b, fHTTPCode, uint64(d.Status.Code))
		}
		b = appendOptions(b, fDeniedHeaders, d.Headers)
		b = appendString(b, fDeniedBody, d.Body)
	case *authv3.CheckResponse_OkResponse:
		b = appendMsgHeader(b, fResponseOK, sizeOptions(r.OkResponse.ResponseHeadersToAdd))
		b = appendOptions(b, fOKResponseHeadersToAdd, r.OkResponse.ResponseHeadersToAdd)
	}
	return b
}

func sizeDenied(d *authv3.DeniedHttpResponse) int {
	n := 0
	if d.Status != nil {
		n += 1 + sizeMsg(sizeVarintField(uint64(d.Status.Code)))
	}
	return n + sizeOptions(d.Headers) + sizeString(d.Body)
}

func sizeOption(h *corev3.HeaderValueOption) int {
	hv := sizeString(h.Header.Key) + sizeString(h.Header.Value)
	n := 1 + sizeMsg(hv) + sizeVarintField(uint64(h.AppendAction))
	if h.KeepEmptyValue {
		n += 2
	}
	return n
}

func sizeOptions(hs []*corev3.HeaderValueOption) int {
	n := 0
	for _, h := range hs {
		n += 1 + sizeMsg(sizeOption(h))
	}
	return n
}

func appendOptions(b []byte, num protowire.Number, hs []*corev3.HeaderValueOption) []byte {
	for _, h := range hs {
		b = appendMsgHeader(b, num, sizeOption(h))
		b = appendMsgHeader(b, fOptionHeader, sizeString(h.Header.Key)+sizeString(h.Header.Value))
		b = appendString(b, fHeaderKey, h.Header.Key)
		b = appendString(b, fHeaderValue, h.Header.Value)
		b = appendVarintField(b, fOptionAction, uint64(h.AppendAction))
		if h.KeepEmptyValue {
			b = appendVarintField(b, fOptionKeepEmpty, 1)
		}
	}
	return b
}

// sortedKeys calls fn with the keys of m in ascending order, as the
// deterministic marshaller writes them, without allocating (m is small:
// see maxSortedEntries).
func sortedKeys(m map[string]*structpb.Value, fn func(k string, v *structpb.Value)) {
	prev, started := "", false
	for range len(m) {
		var next string
		var val *structpb.Value
		found := false
		for k, v := range m {
			if (!started || k > prev) && (!found || k < next) {
				next, val, found = k, v, true
			}
		}
		fn(next, val)
		prev, started = next, true
	}
}

func sizeEntry(k string, v *structpb.Value) int {
	return sizeString(k) + 1 + sizeMsg(sizeValue(v))
}

func sizeStruct(s *structpb.Struct) int {
	n := 0
	for k, v := range s.Fields {
		n += 1 + sizeMsg(sizeEntry(k, v))
	}
	return n
}

func appendStruct(b []byte, s *structpb.Struct) []byte {
	sortedKeys(s.Fields, func(k string, v *structpb.Value) {
		b = appendMsgHeader(b, fStructFields, sizeEntry(k, v))
		b = appendString(b, fEntryKey, k)
		b = appendMsgHeader(b, fEntryValue, sizeValue(v))
		b = appendValue(b, v)
	})
	return b
}

// A Value's kind is a oneof: set, it is written even when zero.
func sizeValue(v *structpb.Value) int {
	switch k := v.Kind.(type) {
	case *structpb.Value_NullValue:
		return 1 + protowire.SizeVarint(uint64(k.NullValue))
	case *structpb.Value_NumberValue:
		return 1 + 8
	case *structpb.Value_StringValue:
		return 1 + sizeMsg(len(k.StringValue))
	case *structpb.Value_BoolValue:
		return 1 + 1
	case *structpb.Value_StructValue:
		return 1 + sizeMsg(sizeStruct(k.StructValue))
	case *structpb.Value_ListValue:
		n := 0
		for _, e := range k.ListValue.Values {
			n += 1 + sizeMsg(sizeValue(e))
		}
		return 1 + sizeMsg(n)
	}
	return 0
}

func appendValue(b []byte, v *structpb.Value) []byte {
	switch k := v.Kind.(type) {
	case *structpb.Value_NullValue:
		b = protowire.AppendVarint(protowire.AppendTag(b, fValueNull, protowire.VarintType), uint64(k.NullValue))
	case *structpb.Value_NumberValue:
		b = protowire.AppendFixed64(protowire.AppendTag(b, fValueNumber, protowire.Fixed64Type), math.Float64bits(k.NumberValue))
	case *structpb.Value_StringValue:
		b = protowire.AppendString(protowire.AppendTag(b, fValueString, protowire.BytesType), k.StringValue)
	case *structpb.Value_BoolValue:
		b = protowire.AppendVarint(protowire.AppendTag(b, fValueBool, protowire.VarintType), protowire.EncodeBool(k.BoolValue))
	case *structpb.Value_StructValue:
		b = appendMsgHeader(b, fValueStruct, sizeStruct(k.StructValue))
		b = appendStruct(b, k.StructValue)
	case *structpb.Value_ListValue:
		n := 0
		for _, e := range k.ListValue.Values {
			n += 1 + sizeMsg(sizeValue(e))
		}
		b = appendMsgHeader(b, fValueList, n)
		for _, e := range k.ListValue.Values {
			b = appendMsgHeader(b, fListValues, sizeValue(e))
			b = appendValue(b, e)
		}
	}
	return b
}
