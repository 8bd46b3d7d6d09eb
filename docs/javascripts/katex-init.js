// Renders the math that pymdownx.arithmatex (generic mode) leaves in the page: \( .. \) in a span, \[ .. \] in a
// div. KaTeX is vendored in assets/katex/, so the site needs no network. Material's document$ fires on every page
// load, including its instant navigation; without it (a page opened on its own) the DOM event does the same.
(function () {
  function renderMath(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      var display = el.tagName === "DIV";
      var tex = el.textContent.trim().replace(/^\\[\(\[]/, "").replace(/\\[\)\]]$/, "");
      katex.render(tex, el, { displayMode: display, throwOnError: false });
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(function () { renderMath(document); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { renderMath(document); });
  }
})();
