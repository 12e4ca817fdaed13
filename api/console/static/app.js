// app.js: loaded last (index.html), starts the console on the page the URL names.
'use strict';

route();
