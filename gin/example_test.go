package weirgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/gin"
	"github.com/weir-dev/weir/quota"
)

// A gin router limited per API key: the third request of a burst of two is
// answered 429 with Retry-After.
func ExampleMiddleware() {
	rules, err := quota.Parse("rules.yaml", []byte(`
rules:
  - id: per-key
    key: [header:X-API-Key]
    limit: 60
    window: 1m
    burst: 2
`))
	if err != nil {
		panic(err)
	}
	node, err := weir.New(weir.Config{Rules: rules})
	if err != nil {
		panic(err)
	}
	defer node.Close()

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(weirgin.Middleware(node, weirgin.Config{}))
	r.GET("/hello", func(c *gin.Context) { c.String(http.StatusOK, "hello") })

	for range 3 {
		req := httptest.NewRequest("GET", "/hello", nil)
		req.Header.Set("X-API-Key", "alice")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"))
	}
	// Output:
	// 200  "per-key";r=1;t=1
	// 200  "per-key";r=0;t=2
	// 429 1 "per-key";r=0;t=2
}
