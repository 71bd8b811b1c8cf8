// Markdown to HTML for the chat page: headings, paragraphs, lists, quotes,
// fenced code (highlighted), inline code, bold, italics and http(s) links.
// Everything the model wrote is escaped first, so its text can never become
// markup of its own.
"use strict";

const Markdown = (() => {
  const escapeHtml = (s) =>
    s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;");

  // Words that are keywords in most languages people ask about.
  const KEYWORDS = new Set(("as async await break case catch class const continue def del do elif else enum export " +
    "extends false fn for from func function go if impl import in interface let loop match mod mut new nil None null " +
    "of pub raise return self Self static struct super switch this throw true True False try type use var void while " +
    "with yield").split(" "));

  // One pass over the code: comments, strings, numbers and keywords become spans.
  const TOKEN = /(\/\/[^\n]*|#[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)|(\b\d[\d_]*(?:\.\d+)?(?:e[+-]?\d+)?\b)|([A-Za-z_][A-Za-z0-9_]*)/g;

  function highlight(code, lang) {
    // '#' starts a comment only where the language says so.
    const hashComments = /^(py|python|sh|bash|shell|zsh|rb|ruby|toml|yaml|yml|r|perl|make|dockerfile)$/i.test(lang || "");
    let out = "";
    let last = 0;
    for (const m of code.matchAll(TOKEN)) {
      let cls = null;
      if (m[1] !== undefined && (hashComments || !m[1].startsWith("#"))) cls = "c";
      else if (m[2] !== undefined) cls = "s";
      else if (m[3] !== undefined) cls = "n";
      else if (m[4] !== undefined && KEYWORDS.has(m[4])) cls = "k";
      if (cls === null) continue;
      out += escapeHtml(code.slice(last, m.index)) + `<span class="hl-${cls}">${escapeHtml(m[0])}</span>`;
      last = m.index + m[0].length;
    }
    return out + escapeHtml(code.slice(last));
  }

  // Inline markup of one escaped line: code spans first (their insides stay literal).
  function inline(text) {
    const parts = text.split(/(`[^`\n]+`)/);
    return parts
      .map((p, i) => {
        if (i % 2 === 1) return `<code>${escapeHtml(p.slice(1, -1))}</code>`;
        let s = escapeHtml(p);
        s = s.replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>");
        s = s.replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>");
        s = s.replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>');
        return s;
      })
      .join("");
  }

  function render(src) {
    const lines = src.replace(/\r\n/g, "\n").split("\n");
    const html = [];
    let para = [];
    let list = null; // {tag, items}
    const flushPara = () => {
      if (para.length) html.push(`<p>${para.map(inline).join("<br>")}</p>`);
      para = [];
    };
    const flushList = () => {
      if (list) html.push(`<${list.tag}>${list.items.map((t) => `<li>${inline(t)}</li>`).join("")}</${list.tag}>`);
      list = null;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
      if (fence) {
        flushPara();
        flushList();
        const body = [];
        i++;
        while (i < lines.length && !/^\s*```\s*$/.test(lines[i])) body.push(lines[i++]);
        // An unclosed fence (still streaming) shows what has come so far.
        const lang = fence[1];
        html.push(`<pre class="code"><div class="code-head"><span>${escapeHtml(lang || "code")}</span>` +
          `<button type="button" class="copy">copy</button></div><code>${highlight(body.join("\n"), lang)}</code></pre>`);
        continue;
      }
      const heading = line.match(/^(#{1,6})\s+(.*)$/);
      const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
      const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
      const quote = line.match(/^>\s?(.*)$/);
      if (heading) {
        flushPara();
        flushList();
        const n = heading[1].length;
        html.push(`<h${n}>${inline(heading[2])}</h${n}>`);
      } else if (bullet || numbered) {
        flushPara();
        const tag = bullet ? "ul" : "ol";
        if (!list || list.tag !== tag) {
          flushList();
          list = { tag, items: [] };
        }
        list.items.push((bullet || numbered)[1]);
      } else if (quote) {
        flushPara();
        flushList();
        html.push(`<blockquote>${inline(quote[1])}</blockquote>`);
      } else if (line.trim() === "") {
        flushPara();
        flushList();
      } else {
        flushList();
        para.push(line);
      }
    }
    flushPara();
    flushList();
    return html.join("");
  }

  return { render, escapeHtml, highlight };
})();
