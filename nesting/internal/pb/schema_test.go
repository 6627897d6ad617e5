package pb

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// reference is reference/gitlab-next.md §3.1 written out by hand: message →
// "number name kind [optional|repeated] [message type]" per field.
var reference = map[string][]string{
	"InitRequest":      {"1 config bytes"},
	"InitResponse":     nil,
	"CreateRequest":    {"1 name string", "2 slot int32 optional"},
	"CreateResponse":   {"1 vm message nesting.VirtualMachine", "2 stompedVmId string optional"},
	"DeleteRequest":    {"1 id string"},
	"DeleteResponse":   nil,
	"ListRequest":      nil,
	"ListResponse":     {"1 vms message repeated nesting.VirtualMachine"},
	"ShutdownRequest":  nil,
	"ShutdownResponse": nil,
	"VirtualMachine":   {"1 id string", "2 name string", "3 addr string"},
}

var referenceMethods = []string{
	"/nesting.Nesting/Init InitRequest InitResponse",
	"/nesting.Nesting/Create CreateRequest CreateResponse",
	"/nesting.Nesting/Delete DeleteRequest DeleteResponse",
	"/nesting.Nesting/List ListRequest ListResponse",
	"/nesting.Nesting/Shutdown ShutdownRequest ShutdownResponse",
}

func TestSchemaMatchesReference(t *testing.T) {
	fd := File_nesting_proto
	if fd.Package() != "nesting" {
		t.Errorf("package %q, want nesting", fd.Package())
	}
	msgs := fd.Messages()
	if msgs.Len() != len(reference) {
		t.Errorf("%d messages, want %d", msgs.Len(), len(reference))
	}
	for i := range msgs.Len() {
		m := msgs.Get(i)
		want, ok := reference[string(m.Name())]
		if !ok {
			t.Errorf("message %s is not in the reference", m.Name())
			continue
		}
		var got []string
		for j := range m.Fields().Len() {
			f := m.Fields().Get(j)
			s := fmt.Sprintf("%d %s %s", f.Number(), f.Name(), f.Kind())
			if f.HasOptionalKeyword() {
				s += " optional"
			}
			if f.Cardinality() == protoreflect.Repeated {
				s += " repeated"
			}
			if f.Kind() == protoreflect.MessageKind {
				s += " " + string(f.Message().FullName())
			}
			got = append(got, s)
		}
		if !slices.Equal(got, want) {
			t.Errorf("message %s fields:\n got  %q\n want %q", m.Name(), got, want)
		}
	}
	if fd.Services().Len() != 1 || fd.Services().Get(0).FullName() != "nesting.Nesting" {
		t.Fatalf("services %v, want nesting.Nesting", fd.Services())
	}
	svc := fd.Services().Get(0)
	var got []string
	for i := range svc.Methods().Len() {
		m := svc.Methods().Get(i)
		if m.IsStreamingClient() || m.IsStreamingServer() {
			t.Errorf("%s streams; every RPC is unary", m.Name())
		}
		got = append(got, fmt.Sprintf("/%s/%s %s %s", svc.FullName(), m.Name(), m.Input().Name(), m.Output().Name()))
	}
	if !slices.Equal(got, referenceMethods) {
		t.Errorf("methods:\n got  %s\n want %s", strings.Join(got, "\n      "), strings.Join(referenceMethods, "\n      "))
	}
	if Nesting_Create_FullMethodName != "/nesting.Nesting/Create" {
		t.Errorf("Create path %s", Nesting_Create_FullMethodName)
	}
}
