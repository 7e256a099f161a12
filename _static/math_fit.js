// Display equations on a narrow screen (a phone is 390 px wide): MathJax draws an equation at
// the body text's size, and one wider than the column scrolls sideways inside its box, which a
// reader may not notice. Once MathJax has typeset the page, and again when the window changes
// size, every display equation wider than its box is drawn smaller, just enough to fit, but
// never below FLOOR of its size; one that still does not fit keeps its scrolling box, with a
// line above it that says so (book.css styles it; tests/test_book_reader.py checks both).
(() => {
  const FLOOR = 0.8;
  const HINT_CLASS = "book-scroll-hint";

  const fit = () => {
    for (const box of document.querySelectorAll("main article div.math mjx-container")) {
      const math = box.querySelector("mjx-math");
      if (!math) continue;
      // MathJax sets the container's own size (about 113% of the text): scale from that
      if (box.dataset.bookSize === undefined) box.dataset.bookSize = box.style.fontSize;
      const size = parseFloat(box.dataset.bookSize) || 100;
      box.style.fontSize = box.dataset.bookSize;
      const width = math.getBoundingClientRect().width;
      const room = box.clientWidth;
      if (width > room + 1) {
        box.style.fontSize = `${size * Math.max(FLOOR, room / width)}%`;
      }
      const wide = box.scrollWidth > box.clientWidth + 1;
      const holder = box.closest("div.math");
      const hint = holder.previousElementSibling;
      const hasHint = hint && hint.classList.contains(HINT_CLASS);
      if (wide && !hasHint) {
        const line = document.createElement("p");
        line.className = `${HINT_CLASS} book-math-hint`;
        line.textContent = "Scroll sideways for the whole equation \u2192";
        holder.before(line);
      } else if (!wide && hasHint) {
        hint.remove();
      }
    }
  };

  const whenTypeset = () => {
    const startup = window.MathJax && window.MathJax.startup;
    if (startup && startup.promise) startup.promise.then(fit);
  };
  window.addEventListener("load", whenTypeset);
  window.addEventListener("resize", fit);
})();
