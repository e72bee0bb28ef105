// Markdown for model answers, rendered safely: the text is parsed into DOM nodes built with
// createElement and text nodes only, never innerHTML, so nothing in a model's output can
// become markup or script. Covers what chat models write: fenced code (with its language),
// inline code, headings, bold and italic, bullet and numbered lists, quotes, rules, and
// links (http, https and mailto only; they open in a new tab without a referrer).

const SAFE_LINK = /^(https?:|mailto:)/i;

function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children) node.append(child);
  return node;
}

// Inline spans: `code`, **bold**, *italic* / _italic_, [text](url). Unclosed markers stay text.
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*([^*\n]+)\*\*|(?<!\w)__([^_\n]+)__(?!\w)|\*([^*\n]+)\*|\b_([^_\n]+)_\b|\[([^\]\n]+)\]\(([^)\s]+)\)/g;

export function inline(text) {
  const out = [];
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) out.push(document.createTextNode(text.slice(last, match.index)));
    const [whole, , code, bold1, bold2, em1, em2, linkText, href] = match;
    if (code !== undefined) out.push(el("code", {}, [code]));
    else if (bold1 !== undefined || bold2 !== undefined) out.push(el("strong", {}, inline(bold1 ?? bold2)));
    else if (em1 !== undefined || em2 !== undefined) out.push(el("em", {}, inline(em1 ?? em2)));
    else if (SAFE_LINK.test(href)) out.push(el("a", { href, target: "_blank", rel: "noopener noreferrer nofollow" }, inline(linkText)));
    else out.push(document.createTextNode(whole));
    last = match.index + whole.length;
  }
  if (last < text.length) out.push(document.createTextNode(text.slice(last)));
  return out;
}

function paragraph(lines) {
  const children = [];
  lines.forEach((line, i) => {
    if (i) children.push(el("br"));
    children.push(...inline(line));
  });
  return el("p", {}, children);
}

// Block structure, line by line. An unclosed fence (an answer still streaming) runs to the end.
export function render(text) {
  const fragment = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let para = [];
  const flush = () => { if (para.length) fragment.append(paragraph(para)); para = []; };
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      for (i += 1; i < lines.length && !lines[i].trim().startsWith(fence[1]); i += 1) body.push(lines[i]);
      const code = el("code", fence[2] ? { "data-lang": fence[2] } : {}, [body.join("\n")]);
      fragment.append(el("pre", { class: "code" }, [code]));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) { flush(); fragment.append(el(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2]))); continue; }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); fragment.append(el("hr")); continue; }
    const item = line.match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = el(ordered ? "ol" : "ul");
      if (ordered && item[1] !== "1." && item[1] !== "1)") list.setAttribute("start", String(parseInt(item[1], 10)));
      let j = i;
      for (; j < lines.length; j += 1) {
        const next = lines[j].match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/);
        if (!next || /\d/.test(next[1]) !== ordered) break;
        list.append(el("li", {}, inline(next[2])));
      }
      i = j - 1;
      fragment.append(list);
      continue;
    }
    const quote = line.match(/^\s*>\s?(.*)$/);
    if (quote) { flush(); fragment.append(el("blockquote", {}, inline(quote[1]))); continue; }
    if (!line.trim()) { flush(); continue; }
    para.push(line);
  }
  flush();
  return fragment;
}
