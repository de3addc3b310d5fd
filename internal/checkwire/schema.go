package checkwire

import (
	"google.golang.org/protobuf/encoding/protowire"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// kind is what the walker does with one field of a message.
type kind uint8

const (
	kScalar        kind = iota // numbers, bools, enums, bytes: only their wire form is checked
	kString                    // a proto3 string: length-delimited values must be valid UTF-8
	kMessage                   // a message (or repeated message): walked
	kMap                       // a map field: entries walked as messages of two fields
	kPackedVarint              // a repeated varint-typed scalar: packed form checked element by element
	kPackedFixed32             // a repeated 4-byte scalar
	kPackedFixed64             // a repeated 8-byte scalar
)

// role is what a field on the path to a decision means to the Request;
// roleNone for every other field, which is checked and skipped.
type role uint8

const (
	roleNone       role = iota
	roleMethod          // HttpRequest.method
	rolePath            // HttpRequest.path
	roleHeaders         // HttpRequest.headers (map)
	roleBody            // HttpRequest.body
	roleRawBody         // HttpRequest.raw_body
	roleExtensions      // AttributeContext.context_extensions (map)
	roleSocket          // Address.socket_address of the source (a oneof case)
	roleOtherAddr       // Address.pipe, Address.envoy_internal_address of the source
	rolePeer            // SocketAddress.address of the source
)

type field struct {
	kind kind
	role role
	msg  *schema // kMessage: the message; kMap: the entry (fields 1 and 2)
}

// schema is a message's fields by number; numbers past the end, and
// fields of kind kScalar, are skipped by their wire form.
type schema struct {
	md     protoreflect.MessageDescriptor
	fields []field
}

func (s *schema) field(n protowire.Number) field {
	if int(n) < len(s.fields) {
		return s.fields[n]
	}
	return field{}
}

// compile builds the schema of the CheckRequest message and of everything
// it can hold, from the generated descriptors, and marks the fields a
// decision reads. The schemas of the messages on the path to those fields
// are private copies, so the same message elsewhere (the destination peer,
// say) is only checked.
func compile() *schema {
	memo := map[protoreflect.FullName]*schema{}
	root := private(compileMessage((&authv3.CheckRequest{}).ProtoReflect().Descriptor(), memo))
	attrs := mark(root, "attributes", roleNone)
	source := mark(attrs, "source", roleNone)
	addr := mark(source, "address", roleNone)
	sock := mark(addr, "socket_address", roleSocket)
	mark(sock, "address", rolePeer)
	mark(addr, "pipe", roleOtherAddr)
	mark(addr, "envoy_internal_address", roleOtherAddr)
	mark(attrs, "context_extensions", roleExtensions)
	request := mark(attrs, "request", roleNone)
	http := mark(request, "http", roleNone)
	mark(http, "method", roleMethod)
	mark(http, "path", rolePath)
	mark(http, "headers", roleHeaders)
	mark(http, "body", roleBody)
	mark(http, "raw_body", roleRawBody)
	return root
}

func private(s *schema) *schema {
	c := *s
	c.fields = append([]field(nil), s.fields...)
	return &c
}

// mark gives the field name of s (a private schema) role r. A message
// field gets a private copy of its schema, which mark returns; nil for
// other fields.
func mark(s *schema, name string, r role) *schema {
	fd := s.md.Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		panic("checkwire: " + string(s.md.FullName()) + " has no field " + name) // the generated code changed
	}
	f := &s.fields[fd.Number()]
	f.role = r
	if f.kind != kMessage {
		return nil
	}
	f.msg = private(f.msg)
	return f.msg
}

func compileMessage(md protoreflect.MessageDescriptor, memo map[protoreflect.FullName]*schema) *schema {
	if s, ok := memo[md.FullName()]; ok {
		return s
	}
	s := &schema{md: md}
	memo[md.FullName()] = s // before the fields: messages may be recursive (Struct, Value)
	fds := md.Fields()
	maxNum := protowire.Number(0)
	for i := 0; i < fds.Len(); i++ {
		maxNum = max(maxNum, fds.Get(i).Number())
	}
	s.fields = make([]field, maxNum+1)
	for i := 0; i < fds.Len(); i++ {
		fd := fds.Get(i)
		s.fields[fd.Number()] = compileField(fd, memo)
	}
	return s
}

func compileField(fd protoreflect.FieldDescriptor, memo map[protoreflect.FullName]*schema) field {
	switch {
	case fd.IsMap():
		return field{kind: kMap, msg: compileMessage(fd.Message(), memo)}
	case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
		return field{kind: kMessage, msg: compileMessage(fd.Message(), memo)}
	case fd.Kind() == protoreflect.StringKind:
		if enforceUTF8(fd) {
			return field{kind: kString}
		}
		return field{}
	case fd.Kind() == protoreflect.BytesKind || !fd.IsList():
		return field{}
	}
	switch fd.Kind() {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return field{kind: kPackedFixed32}
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return field{kind: kPackedFixed64}
	}
	return field{kind: kPackedVarint}
}

// enforceUTF8 is the protobuf runtime's rule: proto3 strings are checked,
// and strings of editions files whose features say so.
func enforceUTF8(fd protoreflect.FieldDescriptor) bool {
	if fd.Syntax() == protoreflect.Editions {
		if e, ok := fd.(interface{ EnforceUTF8() bool }); ok {
			return e.EnforceUTF8()
		}
	}
	return fd.Syntax() == protoreflect.Proto3
}
