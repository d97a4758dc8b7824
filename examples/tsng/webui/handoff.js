// tsng sign-in: the editor's answer to the one-time code that the page
// `tsng ui` wrote posted here. It keeps the session token in this origin's
// session storage (never a cookie, never a URL) and replaces this page, and
// its history entry, with the editor.
"use strict";
(() => {
  const m = document.querySelector('meta[name="tsng-session"]');
  if (m) {
    if (m.content) sessionStorage.setItem("tsng-token", m.content);
    m.remove();
  }
  location.replace("/" + location.hash);
})();
