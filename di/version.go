package di

import "runtime/debug"

// Version is the release, set at build time with
// -ldflags "-X github.com/tokenguard/tokenguard/di.Version=v1.2.3".
// Without it the module version from the build info is used, else "dev".
var Version string

// AppVersion reports the version the apps announce.
func AppVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// UserAgent is what app ("server", "worker", "batch") sends to the
// external API: tokenguard-<app>/<version>.
func UserAgent(app string) string { return "tokenguard-" + app + "/" + AppVersion() }
