package webui

import (
	"strings"
	"testing"
)

func renderAll(log string) (string, []logOp) {
	r := newLogRenderer(true)
	ops := r.Write([]byte(log))
	ops = append(ops, r.Flush()...)
	var b strings.Builder
	writeLogHTML(&b, ops)
	return b.String(), ops
}

func TestLogRendererColoursAndEscaping(t *testing.T) {
	got, _ := renderAll("\x1b[32;1mok\x1b[0m <b>&\n\x1b[38;5;208morange\x1b[39m plain\n\x1b[38;2;255;0;0mred\n")
	for _, want := range []string{
		`<span class="term-fg-2 term-bold">ok</span> &lt;b&gt;&amp;`,
		`<span class="term-fg-208">orange</span> plain`,
		`<span class="term-fg-196">red</span>`,
		`id="L3"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered log lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "\x1b") || strings.Contains(got, "<b>") {
		t.Errorf("escape or markup leaked: %q", got)
	}
}

func TestLogRendererStyleCarriesAcrossLinesAndWrites(t *testing.T) {
	r := newLogRenderer(false)
	ops := r.Write([]byte("\x1b[31mred st"))
	if len(ops) != 0 {
		t.Fatalf("incomplete line rendered: %+v", ops)
	}
	ops = r.Write([]byte("ill\nstill red\x1b[0m\n"))
	if len(ops) != 2 || ops[0].HTML != `<span class="term-fg-1">red still</span>` || ops[1].HTML != `<span class="term-fg-1">still red</span>` {
		t.Fatalf("ops %+v", ops)
	}
}

func TestLogRendererSections(t *testing.T) {
	log := "Running with berth\n" +
		"section_start:1700000000:prepare_script\r\x1b[0K\x1b[0K\x1b[36;1mPreparing\x1b[0;m\n" +
		"prep line\n" +
		"\x1b[0Ksection_start:1700000001:inner[collapsed=true]\r\x1b[0KInner header\n" +
		"inner line\n" +
		"\x1b[0Ksection_end:1700000003:inner\r\x1b[0K\n" +
		"section_end:1700000065:prepare_script\r\x1b[0K\n" +
		"after\n"
	html, ops := renderAll(log)
	var kinds []string
	for _, op := range ops {
		kinds = append(kinds, op.Kind)
	}
	if got := strings.Join(kinds, ","); got != "line,start,line,start,line,end,end,line" {
		t.Fatalf("ops %s", got)
	}
	if ops[6].Duration != "01:05" || ops[5].Duration != "00:02" || !ops[3].Collapsed || ops[1].Start != "2023-11-14T22:13:20Z" {
		t.Fatalf("section details: %+v", ops)
	}
	for _, want := range []string{
		`<details class="section" data-section="prepare_script" data-ended open><summary class="line section-header">`,
		`<span class="term-fg-6 term-bold">Preparing</span>`,
		`<span class="section-duration">01:05</span>`,
		`<details class="section" data-section="inner" data-ended><summary`,
		`Inner header</span><span class="section-duration">00:02</span>`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("HTML lacks %q:\n%s", want, html)
		}
	}
	if strings.Count(html, "<details") != strings.Count(html, "</details>") {
		t.Errorf("unbalanced sections:\n%s", html)
	}
}

func TestLogRendererCarriageReturnsAndTimestamps(t *testing.T) {
	_, ops := renderAll("10%\r50%\r100%\r\n2024-03-14T12:34:56.123456Z 00O hello\n2024-03-14T12:34:57.000001Z 01E+ world\n")
	if ops[0].HTML != "100%" {
		t.Errorf("overprinted line shows %q", ops[0].HTML)
	}
	if ops[1].HTML != "hello" || ops[1].Time != "2024-03-14T12:34:56.123456Z" || ops[2].HTML != "world" {
		t.Errorf("timestamped lines: %+v", ops[1:])
	}
}

func TestLogRendererUnbalancedSections(t *testing.T) {
	// An end without a start is dropped; a start without an end stays
	// open and the markup is still well formed.
	html, _ := renderAll("section_end:1:nope\r\x1b[0K\nsection_start:1:open\r\x1b[0Kheader\nbody\n")
	if strings.Count(html, "<details") != 1 || strings.Count(html, "</details>") != 1 {
		t.Fatalf("HTML:\n%s", html)
	}
}

func FuzzLogRenderer(f *testing.F) {
	f.Add([]byte("\x1b[1;31mx\x1b[0m\nsection_start:1:a[collapsed=true]\r\x1b[0Kh\nsection_end:2:a\r\x1b[0K\n"), 3)
	f.Add([]byte("2024-03-14T12:34:56.123456Z 00O+ \x1b[38;2;1;2;3m\r\r\n"), 1)
	f.Add([]byte("\x1b[38;5;999;48;2;300m\x1b[\x1b"), 2)
	f.Fuzz(func(t *testing.T, log []byte, split int) {
		// Rendered in one piece or two, a log gives the same ops.
		whole := newLogRenderer(true)
		a := append(whole.Write(log), whole.Flush()...)
		if split < 0 {
			split = -split
		}
		split %= len(log) + 1
		parts := newLogRenderer(true)
		b := append(parts.Write(log[:split]), parts.Write(log[split:])...)
		b = append(b, parts.Flush()...)
		if len(a) != len(b) {
			t.Fatalf("%d ops whole, %d in two pieces", len(a), len(b))
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("op %d: %+v whole, %+v in pieces", i, a[i], b[i])
			}
		}
		var sb strings.Builder
		writeLogHTML(&sb, a)
		out := sb.String()
		if strings.ContainsAny(out, "\x1b\r") || strings.Count(out, "<details") != strings.Count(out, "</details>") {
			t.Fatalf("bad HTML for %q: %q", log, out)
		}
		for _, op := range a {
			// Only the renderer's own spans are markup.
			rest := strings.NewReplacer("</span>", "").Replace(op.HTML)
			for i := strings.Index(rest, "<"); i >= 0; i = strings.Index(rest, "<") {
				if !strings.HasPrefix(rest[i:], `<span class="`) {
					t.Fatalf("markup from the log: %q", op.HTML)
				}
				rest = rest[i+1:]
			}
		}
	})
}
