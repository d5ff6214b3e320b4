// Opened from file://, a browser does not let the page read the search index (a file that the
// theme's search loads in a web worker), so the search would say "Searching..." for ever. There
// the search box and the search page say instead that search needs the site served over HTTP.
(function () {
  if (window.location.protocol !== "file:") {
    return;
  }
  var message =
    "Search needs the site served by a web server: run mkdocs serve in the repository, or " +
    "python -m http.server in the built site's folder, and open the address it prints. " +
    "Opened as files (file://), the browser does not let these pages read their search index.";
  document.addEventListener("DOMContentLoaded", function () {
    var inputs = document.querySelectorAll('div[role="search"] input[name="q"], #mkdocs-search-query');
    inputs.forEach(function (input) {
      input.placeholder = "Search needs a web server";
      input.title = message;
    });
    var results = document.getElementById("mkdocs-search-results");
    if (results) {
      results.textContent = message;
      results.setAttribute("data-no-results-text", message);
    }
  });
})();
