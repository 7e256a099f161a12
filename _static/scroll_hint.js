// Wide tables on a narrow screen: a table wider than its box scrolls sideways inside it,
// which a reader on a phone cannot tell from a table with fewer columns. Above every such
// box this adds one line, "Scroll sideways for more columns", and removes it again when the
// window grows wide enough (book.css styles it; tests/test_book_reader.py checks it).
(() => {
  const HINT_CLASS = "book-scroll-hint";

  const scrollBox = (table) => {
    for (let box = table.parentElement; box && box.tagName !== "ARTICLE"; box = box.parentElement) {
      const overflow = getComputedStyle(box).overflowX;
      if (overflow === "auto" || overflow === "scroll") return box;
    }
    return null;
  };

  const update = () => {
    for (const table of document.querySelectorAll("main article table")) {
      const box = scrollBox(table);
      if (!box) continue;
      const hint = box.previousElementSibling;
      const hasHint = hint && hint.classList.contains(HINT_CLASS);
      const wide = box.scrollWidth > box.clientWidth + 1;
      if (wide && !hasHint) {
        const line = document.createElement("p");
        line.className = HINT_CLASS;
        line.textContent = "Scroll sideways for more columns \u2192";
        box.before(line);
      } else if (!wide && hasHint) {
        hint.remove();
      }
    }
  };

  window.addEventListener("load", update);
  window.addEventListener("resize", update);
})();
