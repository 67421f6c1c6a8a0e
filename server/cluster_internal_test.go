package server

import (
	"bytes"
	"io"
	"reflect"
	"testing"

	"github.com/hashicorp/raft"
)

// TestFSM_MembersCommandsAndSnapshot: opSetMember and opRemoveMember
// change the registry, which a snapshot carries as its trailing section; a
// snapshot without the section (an earlier version's) restores an empty
// registry and the same lock table.
func TestFSM_MembersCommandsAndSnapshot(t *testing.T) {
	f := newFSM(nil)
	cmds := []command{
		{op: opAcquire, key: "k", owner: "owner-a-0000", ttl: 1e9, maxWaiters: 10, maxLeases: 10},
		{op: opSetMember, key: "n1", holder: "127.0.0.1:7450", session: "inc1"},
		{op: opSetMember, key: "n2", holder: "127.0.0.1:7460", session: "inc2"},
		{op: opSetMember, key: "n3", holder: "127.0.0.1:7470"},
		{op: opRemoveMember, key: "n2"},
	}
	for i, c := range cmds {
		data := c.encode()
		dc, err := decodeCommand(data)
		if err != nil || dc.key != c.key || dc.holder != c.holder || dc.session != c.session {
			t.Fatalf("command %d: decoded %+v, %v", i, dc, err)
		}
		if r := f.ApplyBatch([]*raft.Log{{Index: uint64(i + 1), Type: raft.LogCommand, Data: data}})[0].(applyResult); r.code == resBadCommand {
			t.Fatalf("command %d not applied", i)
		}
	}
	want := map[string]member{"n1": {"127.0.0.1:7450", "inc1"}, "n3": {"127.0.0.1:7470", ""}}
	if !reflect.DeepEqual(f.members, want) {
		t.Fatalf("members %v, want %v", f.members, want)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	data := sink.Bytes()
	g := newFSM(nil)
	if err := g.Restore(io.NopCloser(&sink)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.members, want) || dump(g) != dump(f) {
		t.Fatalf("restored members %v (want %v), table:\n%s\nwant:\n%s", g.members, want, dump(g), dump(f))
	}
	// Without the trailing section: an earlier version's snapshot.
	table, members, err := splitMembersSection(data)
	if err != nil || !reflect.DeepEqual(members, want) {
		t.Fatalf("split: %v %v", members, err)
	}
	old := newFSM(nil)
	if err := old.Restore(io.NopCloser(&memSink{Buffer: *bytes.NewBuffer(table)})); err != nil {
		t.Fatal(err)
	}
	if len(old.members) != 0 || dump(old) != dump(f) {
		t.Fatalf("old-format restore: members %v, table:\n%s", old.members, dump(old))
	}
	// A corrupt section is refused, not half-read.
	bad := append([]byte(nil), data...)
	bad[len(bad)-len(membersTrailer)-1] = 0xff
	if _, _, err := splitMembersSection(bad); err == nil {
		t.Fatal("a section of a wrong length was accepted")
	}
}
