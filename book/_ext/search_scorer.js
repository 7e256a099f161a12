// The book's search, offline (book/_ext/offline_search.py): Sphinx runs this file after its
// searchtools.js on the search page. A page whose title contains the query ranks first, then
// a section whose heading contains it, then the pages whose text contains the query exactly;
// each result shows a snippet of its page's text around the query, taken from
// window.BOOK_PAGE_TEXT (_static/book_search_text.js): nothing is fetched. Sphinx appends
// this file to language_data.js, whose last statement has no semicolon: a block, not a
// function called at once, keeps the names local without being read as a call.
{
  const PAGE_TITLE_BONUS = 3000;
  const SECTION_TITLE_BONUS = 2000;
  const EXACT_MATCH_BONUS = 1000;
  const SNIPPET_BEFORE = 80;
  const SNIPPET_AFTER = 160;

  const pageTexts = () => window.BOOK_PAGE_TEXT || {};
  const currentQuery = () =>
    (new URLSearchParams(window.location.search).get("q") || "").trim();

  // A result's title is its page's title, or "page title > section heading" for a result
  // found in a heading (its anchor then names the section).
  Scorer.score = (result) => {
    const [docName, title, anchor, , score] = result;
    const query = currentQuery().toLowerCase();
    if (!query) return score;
    const headings = String(title || "").toLowerCase().split(" > ");
    if (!anchor && headings[0].includes(query)) return score + PAGE_TITLE_BONUS;
    if (anchor && headings[headings.length - 1].includes(query)) {
      return score + SECTION_TITLE_BONUS;
    }
    const text = (pageTexts()[docName] || "").toLowerCase();
    return text.includes(query) ? score + EXACT_MATCH_BONUS : score;
  };

  // Where the snippet of a page centres: the whole query, else its first word found.
  const findQuery = (lowerText, query) => {
    const whole = lowerText.indexOf(query);
    if (whole >= 0) return [whole, query.length];
    for (const word of query.split(/[^\p{L}\p{N}]+/u)) {
      const at = word.length > 2 ? lowerText.indexOf(word) : -1;
      if (at >= 0) return [at, word.length];
    }
    return [0, 0];
  };

  const snippetFor = (docName, query) => {
    const text = pageTexts()[docName];
    if (!text) return null;
    const [at, length] = findQuery(text.toLowerCase(), query.toLowerCase());
    const start = Math.max(0, text.lastIndexOf(" ", Math.max(0, at - SNIPPET_BEFORE)));
    const endSpace = text.indexOf(" ", at + length + SNIPPET_AFTER);
    const end = endSpace < 0 ? text.length : endSpace;
    const paragraph = document.createElement("p");
    paragraph.classList.add("context");
    paragraph.append((start > 0 ? "… " : "") + text.slice(start, at).trimStart());
    if (length) {
      const found = document.createElement("span");
      found.classList.add("highlighted");
      found.textContent = text.slice(at, at + length);
      paragraph.append(found);
    }
    paragraph.append(text.slice(at + length, end) + (end < text.length ? " …" : ""));
    return paragraph;
  };

  const docNameOf = (link) => {
    const path = link.getAttribute("href").split("#")[0];
    const suffix = DOCUMENTATION_OPTIONS.LINK_SUFFIX || ".html";
    return path.endsWith(suffix) ? path.slice(0, -suffix.length) : path;
  };

  const addSnippets = () => {
    const query = currentQuery();
    if (!query) return;
    for (const item of document.querySelectorAll("ul.search > li")) {
      if (item.dataset.bookSnippet) continue;
      item.dataset.bookSnippet = "1";
      const link = item.querySelector("a");
      const snippet = link && snippetFor(docNameOf(link), query);
      if (snippet) item.appendChild(snippet);
    }
  };

  document.addEventListener("DOMContentLoaded", () => {
    new MutationObserver(addSnippets).observe(document.body, {childList: true, subtree: true});
  });
}
