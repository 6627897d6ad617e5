// Package wiretest speaks the fleeting plugin protocol from its description
// alone (reference/gitlab-protocol.md §7.3, §7.3a), without Berth's
// generated code or go-plugin: a protobuf schema written by hand from the
// reference's table, dynamic messages, a handshake done by hand. Tests use
// it to prove that Berth's host drives a plugin written by somebody else,
// and that Berth's plugins serve a host written by somebody else.
package wiretest

import (
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The handshake of the reference, written out again on purpose.
const (
	CookieKey   = "FLEETING_INSTANCE_GROUP_PLUGIN"
	CookieValue = "4c6410b1-cb78-4962-8c76-ab936d0ea908"
	Service     = "proto.InstanceGroup"
)

// Field is one row of the reference's wire table.
type Field struct {
	Name     string
	Number   int32
	Kind     protoreflect.Kind
	Message  string // for message and enum fields: the type's name
	Repeated bool
}

// Messages is the wire table of §7.3a, message by message.
var Messages = map[string][]Field{
	"Empty":    nil,
	"Settings": {{Name: "connector_config", Number: 1, Kind: protoreflect.MessageKind, Message: "ConnectorConfig"}},
	"ConnectorConfig": {
		{Name: "os", Number: 1, Kind: protoreflect.StringKind},
		{Name: "arch", Number: 2, Kind: protoreflect.StringKind},
		{Name: "protocol", Number: 3, Kind: protoreflect.StringKind},
		{Name: "username", Number: 4, Kind: protoreflect.StringKind},
		{Name: "password", Number: 5, Kind: protoreflect.StringKind},
		{Name: "key", Number: 6, Kind: protoreflect.BytesKind},
		{Name: "useStaticCredentials", Number: 7, Kind: protoreflect.BoolKind},
		{Name: "keepalive", Number: 8, Kind: protoreflect.Int64Kind},
		{Name: "timeout", Number: 9, Kind: protoreflect.Int64Kind},
		{Name: "protocol_port", Number: 10, Kind: protoreflect.Int64Kind},
	},
	"InitRequest": {
		{Name: "config", Number: 1, Kind: protoreflect.BytesKind},
		{Name: "settings", Number: 2, Kind: protoreflect.MessageKind, Message: "Settings"},
	},
	"InitResponse": {
		{Name: "id", Number: 1, Kind: protoreflect.StringKind},
		{Name: "max_size", Number: 2, Kind: protoreflect.Uint32Kind},
		{Name: "version", Number: 3, Kind: protoreflect.StringKind},
		{Name: "build_info", Number: 4, Kind: protoreflect.StringKind},
	},
	"UpdateResponse": {
		{Name: "instance", Number: 1, Kind: protoreflect.StringKind},
		{Name: "state", Number: 2, Kind: protoreflect.EnumKind, Message: "State"},
	},
	"IncreaseRequest":    {{Name: "n", Number: 1, Kind: protoreflect.Uint32Kind}},
	"IncreaseResponse":   {{Name: "succeeded", Number: 1, Kind: protoreflect.Uint32Kind}},
	"DecreaseRequest":    {{Name: "instances", Number: 1, Kind: protoreflect.StringKind, Repeated: true}},
	"DecreaseResponse":   {{Name: "succeeded", Number: 1, Kind: protoreflect.StringKind, Repeated: true}},
	"ConnectInfoRequest": {{Name: "instance", Number: 1, Kind: protoreflect.StringKind}},
	"ConnectInfoResponse": {
		{Name: "connector", Number: 1, Kind: protoreflect.MessageKind, Message: "ConnectorConfig"},
		{Name: "ExternalAddr", Number: 2, Kind: protoreflect.StringKind},
		{Name: "InternalAddr", Number: 3, Kind: protoreflect.StringKind},
		{Name: "expires", Number: 4, Kind: protoreflect.Int64Kind},
	},
	"HeartbeatRequest": {{Name: "instance", Number: 1, Kind: protoreflect.StringKind}},
}

// StateValues is the State enum of the reference.
var StateValues = []string{"creating", "running", "deleting", "deleted", "timeout"}

// Method is one rpc of the reference.
type Method struct {
	Name, Input, Output string
	ServerStreaming     bool
}

// Methods is the rpc table of §7.3a.
var Methods = []Method{
	{"Init", "InitRequest", "InitResponse", false},
	{"Update", "Empty", "UpdateResponse", true},
	{"Increase", "IncreaseRequest", "IncreaseResponse", false},
	{"Decrease", "DecreaseRequest", "DecreaseResponse", false},
	{"ConnectInfo", "ConnectInfoRequest", "ConnectInfoResponse", false},
	{"Heartbeat", "HeartbeatRequest", "Empty", false},
	{"Shutdown", "Empty", "Empty", false},
}

var kindType = map[protoreflect.Kind]descriptorpb.FieldDescriptorProto_Type{
	protoreflect.StringKind:  descriptorpb.FieldDescriptorProto_TYPE_STRING,
	protoreflect.BytesKind:   descriptorpb.FieldDescriptorProto_TYPE_BYTES,
	protoreflect.BoolKind:    descriptorpb.FieldDescriptorProto_TYPE_BOOL,
	protoreflect.Int64Kind:   descriptorpb.FieldDescriptorProto_TYPE_INT64,
	protoreflect.Uint32Kind:  descriptorpb.FieldDescriptorProto_TYPE_UINT32,
	protoreflect.MessageKind: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE,
	protoreflect.EnumKind:    descriptorpb.FieldDescriptorProto_TYPE_ENUM,
}

// File is the reference schema as a file descriptor, not registered
// anywhere (so it cannot clash with Berth's generated code).
var File = mustFile()

func mustFile() protoreflect.FileDescriptor {
	s := func(v string) *string { return &v }
	fp := &descriptorpb.FileDescriptorProto{
		Name:    s("wiretest/reference.proto"),
		Package: s("proto"),
		Syntax:  s("proto3"),
	}
	st := &descriptorpb.EnumDescriptorProto{Name: s("State")}
	for i, v := range StateValues {
		st.Value = append(st.Value, &descriptorpb.EnumValueDescriptorProto{Name: s(v), Number: ptr(int32(i))})
	}
	fp.EnumType = append(fp.EnumType, st)
	for name, fields := range Messages {
		m := &descriptorpb.DescriptorProto{Name: s(name)}
		for _, f := range fields {
			label := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
			if f.Repeated {
				label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
			}
			fd := &descriptorpb.FieldDescriptorProto{
				Name:     s(f.Name),
				Number:   ptr(f.Number),
				Label:    &label,
				Type:     ptr(kindType[f.Kind]),
				JsonName: s(f.Name),
			}
			if f.Message != "" {
				fd.TypeName = s(".proto." + f.Message)
			}
			m.Field = append(m.Field, fd)
		}
		fp.MessageType = append(fp.MessageType, m)
	}
	svc := &descriptorpb.ServiceDescriptorProto{Name: s("InstanceGroup")}
	for _, m := range Methods {
		svc.Method = append(svc.Method, &descriptorpb.MethodDescriptorProto{
			Name:            s(m.Name),
			InputType:       s(".proto." + m.Input),
			OutputType:      s(".proto." + m.Output),
			ServerStreaming: ptr(m.ServerStreaming),
		})
	}
	fp.Service = append(fp.Service, svc)
	fd, err := protodesc.NewFile(fp, nil)
	if err != nil {
		panic(err)
	}
	return fd
}

func ptr[T any](v T) *T { return &v }

// New returns an empty dynamic message of the reference schema.
func New(name string) *dynamicpb.Message {
	md := File.Messages().ByName(protoreflect.Name(name))
	if md == nil {
		panic("wiretest: no message " + name)
	}
	return dynamicpb.NewMessage(md)
}

// Set sets field name of m (a scalar, []byte, a nested message, or a
// []string for repeated strings) and returns m.
func Set(m *dynamicpb.Message, name string, v any) *dynamicpb.Message {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		panic("wiretest: no field " + name)
	}
	switch x := v.(type) {
	case []string:
		l := m.Mutable(fd).List()
		for _, s := range x {
			l.Append(protoreflect.ValueOfString(s))
		}
	case *dynamicpb.Message:
		m.Set(fd, protoreflect.ValueOfMessage(x))
	case protoreflect.EnumNumber:
		m.Set(fd, protoreflect.ValueOfEnum(x))
	default:
		m.Set(fd, protoreflect.ValueOf(v))
	}
	return m
}

// Get returns field name of m as a Go value: scalars as themselves,
// repeated strings as []string, messages as *dynamicpb.Message, enums as
// their number.
func Get(m protoreflect.Message, name string) any {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		panic("wiretest: no field " + name)
	}
	v := m.Get(fd)
	switch {
	case fd.IsList():
		var out []string
		for i := 0; i < v.List().Len(); i++ {
			out = append(out, v.List().Get(i).String())
		}
		return out
	case fd.Kind() == protoreflect.MessageKind:
		return v.Message().Interface()
	case fd.Kind() == protoreflect.EnumKind:
		return v.Enum()
	}
	return v.Interface()
}
