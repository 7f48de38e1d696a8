// Package docs holds the project's guides; its tests check them.
package docs
