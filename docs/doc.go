// Package docs holds the user documentation and the tests that keep it true.
package docs
